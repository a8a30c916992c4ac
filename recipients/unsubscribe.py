"""One-click unsubscribe (RFC 8058): the token in an email's `List-Unsubscribe` URL and
what a `POST` of `List-Unsubscribe=One-Click` to it does.

The token is a Fernet token (AES-128-CBC + HMAC-SHA256, authenticated) of `[tenant id, category,
address]` under a key derived from `SECRET_KEY` (and `SECRET_KEY_FALLBACKS`, so a rotated secret's
links keep working while it is listed there): nobody can forge or alter one, and the address does not
appear in the URL, the web server's logs or the mail headers. Tokens never expire; revoking them is
removing the secret they were made under from `SECRET_KEY_FALLBACKS` (after rotating `SECRET_KEY`).
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

from core.channels import Channel
from recipients import suppressions
from recipients.models import Suppression, SuppressionReason

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


def read_token(token: str) -> tuple[uuid.UUID, str, str]:
    """(tenant id, category, address); raises BadToken."""
    try:
        padded = token + "=" * (-len(token) % 4)
        tenant_hex, category, address = json.loads(_keys().decrypt(padded.encode()))
        return uuid.UUID(hex=tenant_hex), str(category), str(address)
    except (InvalidToken, ValueError, TypeError, UnicodeError):
        raise BadToken() from None


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
