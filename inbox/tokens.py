"""Inbox tokens: what a subscriber's browser holds to read its own feed on /inbox/v1/.

A token is signed, not stored: `ibx_` + base64url(tenant id, generation, expires-at s, external id)
+ `.` + base64url(HMAC-SHA256 of that payload). The key is derived from Django's SECRET_KEY for this
purpose only (so it signs nothing else and nothing else signs tokens), and issuing one costs no write.
Revocation is one row per subscriber (`inbox_token_revocations.generation`, counted up by each
revoke): a token of an earlier generation is refused, so "every token issued until then" holds
whatever the web processes' clocks say. A token names one subscriber of one tenant and is accepted only by the inbox
authentication; the tenant API takes `op_` keys looked up by hash, so a token cannot call it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings

from inbox import statements

PREFIX = "ibx_"
MAX_TTL_SECONDS = 604800
DEFAULT_TTL_SECONDS = 86400
MAX_TOKEN_CHARS = 1024

# The clock tokens are issued, checked and revoked by (seconds since the epoch); tests move it.
clock: Callable[[], float] = time.time


@dataclass(frozen=True, slots=True)
class Claims:
    tenant_id: uuid.UUID
    subscriber: str
    generation: int
    expires_at: int


def _key() -> bytes:
    return hmac.new(settings.SECRET_KEY.encode(), b"omnipost.inbox-token.v1", hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue(tenant_id: uuid.UUID, subscriber: str, ttl_seconds: int) -> tuple[str, datetime]:
    """A token for `subscriber` of the tenant, valid for `ttl_seconds`; and when it expires."""
    expires = int(clock()) + ttl_seconds
    generation = statements.token_generation(tenant_id, subscriber)
    payload = f"{tenant_id.hex}:{generation}:{expires}:{subscriber}".encode()
    signature = hmac.new(_key(), payload, hashlib.sha256).digest()
    return f"{PREFIX}{_b64(payload)}.{_b64(signature)}", datetime.fromtimestamp(expires, UTC)


def check_ttl(value: object) -> int:
    if value is None:
        return DEFAULT_TTL_SECONDS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TTL_SECONDS:
        raise ValueError(f"must be an integer from 1 to {MAX_TTL_SECONDS} (seconds)")
    return value


def verify(token: str) -> Claims | None:
    """The token's claims if it is well-formed, signed by us, not expired and not revoked; else None."""
    claims = decode(token)
    if claims is None:
        return None
    # refused once revoked, and once the subscriber is deleted (it can no longer be revoked then)
    if claims.generation != statements.live_generation(claims.tenant_id, claims.subscriber):
        return None
    return claims


def decode(token: str) -> Claims | None:
    """The token's claims if it is well-formed, signed by us and not expired; else None. Whether it is
    revoked is the caller's second step (`verify`; the stream asks the database itself, inbox.live)."""
    if not token.startswith(PREFIX) or len(token) > MAX_TOKEN_CHARS:
        return None
    try:
        encoded, _, signed = token[len(PREFIX) :].partition(".")
        payload, signature = _unb64(encoded), _unb64(signed)
    except (ValueError, TypeError):
        return None
    if not hmac.compare_digest(hmac.new(_key(), payload, hashlib.sha256).digest(), signature):
        return None
    try:
        tenant_hex, generation, expires, subscriber = payload.decode().split(":", 3)
        claims = Claims(uuid.UUID(tenant_hex), subscriber, int(generation), int(expires))
    except ValueError:
        return None
    if clock() >= claims.expires_at:
        return None
    return claims


def revoke(tenant_id: uuid.UUID, subscriber: str) -> None:
    """Refuse every token of the subscriber issued until now."""
    statements.revoke(tenant_id, subscriber)
