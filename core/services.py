"""Workflows of the core app that the admin, the commands and any API call alike (STYLE.md 1, 3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import IntegrityError, models, transaction

from core.api.errors import Conflict
from core.models import ApiKey, AuditEvent, Tenant

CREATED_ACTION = "api_key.created"
REVOKED_ACTION = "api_key.revoked"
WEIGHT_ACTION = "tenant.weight_changed"


class ApiKeyAlreadyRevoked(Exception):
    """Revoking a key twice is an error, so a script that names the wrong key notices."""

    def __init__(self, key: ApiKey) -> None:
        super().__init__(f"API key {key} was already revoked")
        self.key = key


def issue_api_key(key: ApiKey, *, actor: str) -> str:
    """Give the unsaved `key` (tenant and name set) a fresh secret, save it and write one
    `api_key.created` audit event, in one transaction. Returns the raw key: shown once, never stored."""
    raw = key.assign_new_secret()
    with transaction.atomic():
        key.save()
        AuditEvent.record(actor=actor, action=CREATED_ACTION, target=key)
    return raw


def revoke_api_key(key: ApiKey, *, actor: str) -> ApiKey:
    """Revoke `key` and write one `api_key.revoked` audit event, in one transaction.

    The revocation is a compare-and-set on `revoked_at IS NULL` (`ApiKey.revoke`), so of two
    concurrent revocations exactly one wins and audits; the other raises `ApiKeyAlreadyRevoked`,
    as does revoking a key that was revoked before."""
    with transaction.atomic():
        if not key.revoke():
            raise ApiKeyAlreadyRevoked(key)
        AuditEvent.record(actor=actor, action=REVOKED_ACTION, target=key)
    return key


def revoke_api_keys(keys: list[ApiKey], *, actor: str) -> int:
    """Revoke each key (one short transaction each); returns how many were revoked now, skipping
    those already revoked."""
    revoked = 0
    for key in keys:
        try:
            revoke_api_key(key, actor=actor)
        except ApiKeyAlreadyRevoked:
            continue
        revoked += 1
    return revoked


def set_tenant_weight(tenant: Tenant, weight: int, *, actor: str) -> Tenant:
    """Set the tenant's fairness `weight` (1–1000) and audit the change, in one transaction. The
    next claim of every dispatcher reads it (it joins `tenants`), so nothing else needs telling."""
    if not 1 <= int(weight) <= 1000:
        raise ValueError("weight must be an integer from 1 to 1000")
    with transaction.atomic():
        before = Tenant.objects.select_for_update().values_list("weight", flat=True).get(pk=tenant.pk)
        Tenant.objects.filter(pk=tenant.pk).update(weight=int(weight))
        tenant.weight = int(weight)
        AuditEvent.record(actor=actor, action=WEIGHT_ACTION, target=tenant, tenant=tenant.pk,
                          details={"weight": int(weight), "previous": before})
    return tenant


Saved = TypeVar("Saved", bound=models.Model)


def save_audited(
    obj: Saved, *, actor: str, noun: str, details: dict[str, Any], fields: Sequence[str] | None,
    conflict: Callable[[IntegrityError], Conflict], before: Callable[[bool, list[str] | None], list[str]] | None = None,
    after: Callable[[bool], None] | None = None,
) -> Saved:  # fmt: skip
    """Create or update `obj` (its `fields` only, and `updated_at`, when given) and write one
    `<noun>.created` / `<noun>.updated` audit event with `details` and the sorted fields, in one
    transaction. `before(created, fields)` runs first in that transaction and returns further fields
    to save; `after(created)` runs once `obj` is saved, before the audit event (which reads `details`
    then, so either hook may add to it); a unique constraint's IntegrityError becomes `conflict(exc)`
    (a 409)."""
    created = obj._state.adding
    try:
        with transaction.atomic():
            if before is not None:
                extra = before(created, None if fields is None else list(fields))
                if fields is not None and extra:
                    fields = [*fields, *extra]
            obj.save(update_fields=None if created or fields is None else [*fields, "updated_at"])
            if after is not None:
                after(created)
            AuditEvent.record(actor=actor, action=f"{noun}.{'created' if created else 'updated'}", target=obj,
                              details={**details, "fields": sorted(fields or [])})  # fmt: skip
    except IntegrityError as exc:
        raise conflict(exc) from None
    return obj
