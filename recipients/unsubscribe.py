"""One-click unsubscribe (RFC 8058): the token in an email's `List-Unsubscribe` URL and
what a `POST` of `List-Unsubscribe=One-Click` to it does.

The token is a Fernet token (AES-128-CBC + HMAC-SHA256, authenticated) of `[tenant id, category,
address]` under a key derived from `SECRET_KEY` (and `SECRET_KEY_FALLBACKS`, so a rotated secret's
links keep working while it is listed there): nobody can forge or alter one, and the address does not
appear in the URL, the web server's logs or the mail headers. Tokens never expire. One token is
revoked by itself with `revoke` (the API's `POST unsubscribe-tokens/revoke`): its SHA-256 is kept in
`unsubscribe_token_revocations` and `read_token` refuses it; all of them at once by removing the secret
they were made under from `SECRET_KEY_FALLBACKS` (after rotating `SECRET_KEY`).
Unsubscribing adds a suppression for that address and category on email (`unsubscribed`), so the
next notifications of that category to that address are `suppressed`, at creation and at dispatch.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import transaction

from core.channels import Channel
from core.models import AuditEvent
from recipients import suppressions
from recipients.models import RevokedUnsubscribeToken, Suppression, SuppressionReason

PATH = "/unsubscribe/"
_LABEL = b"omnipost one-click unsubscribe v1"


class BadToken(Exception):
    """Forged, altered or unreadable: a 400 that changes nothing."""


@lru_cache(maxsize=4)
def _fernet(secrets: tuple[str, ...]) -> MultiFernet:
    keys = [Fernet(base64.urlsafe_b64encode(hashlib.sha256(_LABEL + s.encode()).digest())) for s in secrets]
    return MultiFernet(keys)


def _keys() -> MultiFernet:
    return _fernet((settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])))


def make_token(tenant_id: Any, address: str, category: str) -> str:
    address = suppressions.normalise(Channel.EMAIL, address)
    payload = json.dumps([uuid.UUID(str(tenant_id)).hex, category, address], separators=(",", ":"))
    return _keys().encrypt(payload.encode()).decode().rstrip("=")


def _decrypt(token: str) -> tuple[uuid.UUID, str, str]:
    try:
        padded = token + "=" * (-len(token) % 4)
        tenant_hex, category, address = json.loads(_keys().decrypt(padded.encode()))
        return uuid.UUID(hex=tenant_hex), str(category), str(address)
    except (InvalidToken, ValueError, TypeError, UnicodeError):
        raise BadToken() from None


def token_digest(token: str) -> str:
    """What names one token in `unsubscribe_token_revocations` (with or without its `=` padding)."""
    return hashlib.sha256(token.rstrip("=").encode("ascii", "replace")).hexdigest()


def read_token(token: str) -> tuple[uuid.UUID, str, str]:
    """(tenant id, category, address); raises BadToken, also for a token revoked by itself."""
    found = _decrypt(token)
    if RevokedUnsubscribeToken.objects.filter(token_digest=token_digest(token)).exists():
        raise BadToken()
    return found


def revoke(tenant_id: Any, token: str, *, actor: str) -> tuple[str, str, bool]:
    """Revoke one of `tenant_id`'s tokens (its link stops working; others stay valid): (category,
    address, whether it was revoked now rather than before). BadToken for a forged token and for
    another tenant's alike: a tenant learns nothing of another's tokens. Audited when it revokes."""
    found_tenant, category, address = _decrypt(token)
    if found_tenant != uuid.UUID(str(tenant_id)):
        raise BadToken()
    with transaction.atomic():
        entry, created = RevokedUnsubscribeToken.objects.get_or_create(
            token_digest=token_digest(token), defaults={"tenant_id": found_tenant}
        )
        if created:
            AuditEvent.record(actor=actor, action="unsubscribe_token.revoked", target=entry,
                              details={"category": category})  # fmt: skip
    return category, address, created


def url(token: str) -> str:
    return f"{settings.OMNIPOST_PUBLIC_URL}{PATH}{token}"


def headers(tenant_id: Any, address: str, category: str) -> tuple[tuple[str, str], ...]:
    """The RFC 8058 headers of one email (none without OMNIPOST_PUBLIC_URL): the https URL, and a
    `mailto:` where a bounce domain is set."""
    if not settings.OMNIPOST_PUBLIC_URL:
        return ()
    token = make_token(tenant_id, address, category)
    targets = [f"<{url(token)}>"]
    if settings.OMNIPOST_BOUNCE_DOMAIN:
        subject = quote("unsubscribe " + token)
        targets.append(f"<mailto:unsubscribe@{settings.OMNIPOST_BOUNCE_DOMAIN}?subject={subject}>")
    return (("List-Unsubscribe", ", ".join(targets)), ("List-Unsubscribe-Post", "List-Unsubscribe=One-Click"))


def unsubscribe(token: str) -> tuple[Suppression, bool]:
    """Opt the token's address out of its category on email; raises BadToken. Idempotent."""
    tenant_id, category, address = read_token(token)
    return suppressions.suppress(
        tenant_id, Channel.EMAIL, address, SuppressionReason.UNSUBSCRIBED, category, actor="system:unsubscribe"
    )
