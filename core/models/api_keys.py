"""API keys: `op_<prefix>_<secret>`, shown once, stored as a SHA-256 hash, revocable."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
from datetime import timedelta

from django.db import models
from django.utils import timezone

from core.models.tenancy import Tenant, TenantQuerySet

KEY_RE = re.compile(r"^op_(?P<test>test_)?(?P<prefix>[A-Za-z0-9]{8})_(?P<secret>[A-Za-z0-9]{32,128})$")
_ALPHABET = string.ascii_letters + string.digits
LAST_USED_RESOLUTION = timedelta(seconds=60)


def _random(n: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


def hash_key(raw_key: str) -> str:
    # Keys carry ~238 bits of entropy (40 of 62 characters), so a fast hash is safe; no per-key salt is needed.
    return hashlib.sha256(raw_key.encode()).hexdigest()


class ApiKeyQuerySet(TenantQuerySet):
    def active(self) -> ApiKeyQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=8, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # A test key (`op_test_…`): what it creates goes to the simulator and is seen by test keys only.
    test = models.BooleanField(default=False, db_default=False)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        db_table = "api_keys"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.key_start}{self.prefix}_…"

    @property
    def key_start(self) -> str:
        return "op_test_" if self.test else "op_"

    @classmethod
    def issue(cls, tenant: Tenant, name: str = "", *, test: bool = False) -> tuple[ApiKey, str]:
        """Create a key; the raw key is returned once and never stored."""
        key = cls(tenant=tenant, name=name, test=test)
        raw = key.assign_new_secret()
        key.save()
        return key, raw

    def assign_new_secret(self) -> str:
        """Set prefix and hash for a fresh key (62^8 prefixes; the unique index catches a clash)."""
        self.prefix = _random(8)
        raw = f"{self.key_start}{self.prefix}_{_random(40)}"
        self.key_hash = hash_key(raw)
        return raw

    @classmethod
    def authenticate(cls, raw_key: str) -> ApiKey | None:
        """The active key of an active tenant, from this process's cache (core.auth_cache: no query
        while warm, revocations reach it within a second) or one query."""
        from core import auth_cache

        match = KEY_RE.fullmatch(raw_key or "")
        if not match:
            return None
        digest = hash_key(raw_key)
        key = auth_cache.cache.get(digest)
        if key is None:
            generation, ttl = auth_cache.cache.generation, auth_cache.ttl()  # before the read
            key = (
                cls.objects.active().select_related("tenant")
                .filter(prefix=match["prefix"], tenant__is_active=True).first()
            )  # fmt: skip
            if key is None or not hmac.compare_digest(key.key_hash, digest):
                return None
            key.tenant.test_mode = key.test  # this key's own Tenant instance: the request's mode
            auth_cache.cache.put(digest, key, ttl, generation)
        key.touch()
        return key

    def touch(self) -> None:
        """Record use at most once a minute, so authentication is not a write per request."""
        now = timezone.now()
        if self.last_used_at and now - self.last_used_at < LAST_USED_RESOLUTION:
            return
        stale = models.Q(last_used_at__isnull=True) | models.Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
        ApiKey.objects.filter(stale, pk=self.pk).update(last_used_at=now)
        self.last_used_at = now

    def revoke(self) -> bool:
        """Revoke (compare-and-set); every web process refuses the key within a second (core.auth_cache)."""
        from core import auth_cache

        now = timezone.now()
        revoked = bool(ApiKey.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=now))
        if revoked:
            self.revoked_at = now
            auth_cache.announce(f"key:{self.prefix}")
        return revoked
