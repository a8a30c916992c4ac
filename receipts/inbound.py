"""The inbound contract: an adapter per provider kind turns one signed vendor request into receipts.

    @adapter("twilio")
    def parse(request: InboundRequest, provider: ProviderView) -> list[Receipt]: ...

An adapter authenticates the request with the vendor's own scheme (raising `Rejected`, answered
`401` with nothing stored; a verified request with a value OmniPost cannot store raises `Invalid`,
answered `400` naming the field), then returns the receipts it carries — possibly none (a vendor state
that is not a receipt still comes back as a `Receipt` with `receipt=None`, so it appears in the
notification's `events`). A request that asks for an answer rather than carrying receipts (an SNS
`SubscriptionConfirmation`) raises `Handled` after doing what it asks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

RECEIPTS = ("delivered", "bounced", "complained", "undelivered", "failed")
BOUNCE_TYPES = ("hard", "soft")


@dataclass(frozen=True, slots=True)
class InboundRequest:
    url: str  # the absolute URL the vendor signed: OMNIPOST_PUBLIC_URL + path (+ query)
    headers: Mapping[str, str]  # case-insensitive (Django's request.headers)
    body: bytes
    form: Mapping[str, str] = field(default_factory=dict)  # parsed application/x-www-form-urlencoded


@dataclass(frozen=True, slots=True)
class ProviderView:
    """What an adapter may know of the provider the URL names (secrets decrypted)."""

    id: int
    tenant_id: str
    kind: str
    config: Mapping[str, Any]
    secrets: Mapping[str, Any]  # current secrets
    previous_secrets: tuple[Mapping[str, Any], ...] = ()  # within the rotation grace period
    # The provider row's updated_at when this view was read: apply_receipts stores nothing if the
    # provider changed since (a cached view verified with secrets that may have been rotated out).
    updated_at: datetime | None = None
    name: str = ""


@dataclass(frozen=True, slots=True)
class Receipt:
    notification_id: str  # as the vendor echoes it; may name an unknown or foreign notification
    type: str  # the event type as shown in `events` (vendor vocabulary normalised: "delivered", "sent", ...)
    occurred_at: datetime  # aware
    receipt: str | None  # one of RECEIPTS, or None for states that are not receipts (queued, sent, deferred)
    bounce_type: str | None = None  # "hard" | "soft" when receipt == "bounced"
    details: Mapping[str, Any] = field(default_factory=dict)  # scrubbed: no recipient, no secret
    event_id: str = ""  # the vendor's own event id; empty means: de-duplicate by `dedup_key` hash
    raw: bytes = b""  # the bytes this receipt came from, for the hash when there is no event id
    # The provider's id of the message (SES's mail.messageId), when `notification_id` is empty: the
    # receipt is about the notification whose send through the receiving provider returned this id
    # (notifications.models.ProviderMessage), never another provider's.
    provider_message_id: str = ""

    @property
    def dedup_key(self) -> str:
        if self.event_id:
            return f"id:{self.event_id}"
        return "sha256:" + hashlib.sha256(self.raw).hexdigest()


class Rejected(Exception):
    """Bad signature, wrong provider, stale timestamp or unreadable payload: 401, nothing stored."""


class Invalid(Exception):
    """A request that verifies but carries a value OmniPost cannot take (a date-time out of the range
    core.validation.check_datetime_range allows): 400 naming the field, nothing stored. Raised only
    after the signature checked out, so a vendor's own mistakes are told apart from forgeries (401)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Handled(Exception):
    """The request was dealt with and carries no receipts (e.g. an SNS subscription confirmed)."""


Adapter = Callable[[InboundRequest, ProviderView], list[Receipt]]
ADAPTERS: dict[str, Adapter] = {}


def adapter(kind: str) -> Callable[[Adapter], Adapter]:
    def register(fn: Adapter) -> Adapter:
        ADAPTERS[kind] = fn
        return fn

    return register
