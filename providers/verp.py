"""VERP return paths: the envelope sender of every SMTP send names its provider and notification.

With `OMNIPOST_BOUNCE_DOMAIN` set, an SMTP send's `MAIL FROM` is `b+<token>@<bounce domain>`
(the `From` header stays the provider's `from_email`), so the bounce a remote server mails back
(RFC 3464) and, where a mailbox provider sends them to the return path, complaint reports
(RFC 5965), reach `manage.py run_bounce_listener` addressed to exactly one notification.

The token is base32 (lowercase, unpadded: mail systems may change the case of a local part) of

    notification UUID (16 bytes) | provider id (big-endian, 1-8 bytes) | tag (10 bytes)

where the tag is HMAC-SHA256, truncated to 80 bits, under a key derived from `SECRET_KEY`
(`SECRET_KEY_FALLBACKS` are accepted when reading, so a key rotation does not orphan bounces of
mail already sent). Without the key nobody can make an address that touches a notification, and
a token names one notification of one provider only. `SECRET_KEY` rather than
`OMNIPOST_ENCRYPTION_KEYS`: bounces arrive days later, after encryption keys may have been rotated
away, and Django's fallbacks are the rotation mechanism operators already know.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import uuid
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings

from core.crypto import HmacSha256

LOCAL_PREFIX = "b+"
TAG_BYTES = 10
_CONTEXT = b"omnipost.verp.v1"
_MIN_BYTES = 16 + 1 + TAG_BYTES
_MAX_BYTES = 16 + 8 + TAG_BYTES


@dataclass(frozen=True, slots=True)
class VerpTarget:
    provider_id: int
    notification_id: str  # canonical UUID string


@lru_cache(maxsize=8)
def _signer(secret: str) -> HmacSha256:
    # A key of its own for VERP, derived from the secret (never the secret itself as a MAC key).
    derived = hmac.new(secret.encode(), _CONTEXT, "sha256").digest()
    return HmacSha256(derived)


def _secrets() -> tuple[str, ...]:
    return (settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ()))


def bounce_domain() -> str:
    return (settings.OMNIPOST_BOUNCE_DOMAIN or "").strip().lower()


def _body(provider_id: int, notification_id: str) -> bytes:
    if not 0 <= provider_id < 2**64:
        raise ValueError("provider id out of range")
    return uuid.UUID(notification_id).bytes + provider_id.to_bytes(max(1, (provider_id.bit_length() + 7) // 8), "big")


def make_token(provider_id: int, notification_id: str) -> str:
    body = _body(provider_id, notification_id)
    tag = _signer(settings.SECRET_KEY).digest(body)[:TAG_BYTES]
    return base64.b32encode(body + tag).decode("ascii").rstrip("=").lower()


def read_token(token: str) -> VerpTarget | None:
    """The provider and notification a token names, or None if it is malformed or forged."""
    if not 44 <= len(token) <= 55 or not token.isascii():  # the base32 lengths of 27..34 bytes
        return None
    try:
        data = base64.b32decode(token.upper() + "=" * (-len(token) % 8))
    except (binascii.Error, ValueError):
        return None
    if not _MIN_BYTES <= len(data) <= _MAX_BYTES:
        return None
    if base64.b32encode(data).decode("ascii").rstrip("=") != token.upper():
        return None  # unused trailing bits set: one spelling per token
    body, tag = data[:-TAG_BYTES], data[-TAG_BYTES:]
    if not any(hmac.compare_digest(_signer(secret).digest(body)[:TAG_BYTES], tag) for secret in _secrets()):
        return None
    return VerpTarget(provider_id=int.from_bytes(body[16:], "big"), notification_id=str(uuid.UUID(bytes=body[:16])))


def return_path(provider_id: int | None, notification_id: str) -> str | None:
    """The envelope sender for this send, or None when no bounce domain is set (or the provider's
    id is unknown, as for a provider built outside the dispatcher)."""
    domain = bounce_domain()
    if not domain or provider_id is None:
        return None
    return f"{LOCAL_PREFIX}{make_token(provider_id, notification_id)}@{domain}"


def read_address(address: str) -> VerpTarget | None:
    """The target of a VERP address of our bounce domain (case-insensitive), else None."""
    domain = bounce_domain()
    local, at, host = address.strip().strip("<>").rpartition("@")
    if not domain or not at or host.lower().rstrip(".") != domain:
        return None
    local = local.lower()
    if not local.startswith(LOCAL_PREFIX):
        return None
    return read_token(local[len(LOCAL_PREFIX) :])
