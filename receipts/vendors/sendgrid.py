"""SendGrid's signed Event Webhook: a JSON array of events, ECDSA-verified, into receipts.

SendGrid signs `timestamp header + raw body` with ECDSA P-256 / SHA-256 and sends the DER signature
base64-encoded in `X-Twilio-Email-Event-Webhook-Signature`, the timestamp (epoch seconds) in
`X-Twilio-Email-Event-Webhook-Timestamp`; the verification key is the provider's
`config.public_key` (base64 SPKI, as SendGrid shows it). This is what the `sendgrid` package's
`EventWebhook.verify_signature` checks (tests hold the two to the same verdicts). A timestamp more
than 5 minutes from now, either way, is stale.

Every event of the array becomes one `Receipt`; its notification is the `notification_id` custom
arg the send put in (providers.kinds.sendgrid), its event id SendGrid's `sg_event_id`.

| event | type in `events` | receipt |
|---|---|---|
| delivered | delivered | delivered |
| bounce (`type` bounce) | bounced | bounced, hard |
| bounce (`type` blocked or expired) | bounced | bounced, soft |
| dropped | dropped | failed |
| spamreport | complained | complained |
| processed, deferred, open, click, unsubscribe, ... | as named | None (shown in `events` only) |
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from core.masking import mask_text
from core.validation import datetime_from_timestamp
from providers.kinds.sendgrid import load_public_key
from receipts.inbound import InboundRequest, Invalid, ProviderView, Receipt, Rejected, adapter

SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"
TOLERANCE_SECONDS = 300
MAX_EVENTS = 10_000
MAX_TEXT_CHARS = 500
MAX_ID_CHARS = 200
SOFT_BOUNCES = frozenset({"blocked", "expired"})
# Event fields kept in `details`: what an operator needs to see why, never the address.
DETAIL_FIELDS = ("sg_event_id", "sg_message_id", "type", "bounce_classification", "status", "reason", "response",
                 "attempt")  # fmt: skip
_ECDSA = ec.ECDSA(hashes.SHA256())


def _now() -> datetime:
    return datetime.now(UTC)


def _verify(request: InboundRequest, provider: ProviderView, now: datetime) -> None:
    try:
        key = load_public_key(provider.config.get("public_key") or "")
    except ValueError:
        raise Rejected("this provider has no Event Webhook verification key (config.public_key)") from None
    signature = request.headers.get(SIGNATURE_HEADER, "")
    timestamp = request.headers.get(TIMESTAMP_HEADER, "").strip()
    if not signature or not timestamp:
        raise Rejected(f"{SIGNATURE_HEADER} and {TIMESTAMP_HEADER} are required")
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
        raise Rejected(f"{TIMESTAMP_HEADER} is not a Unix time in seconds")
    if abs(now.timestamp() - int(timestamp)) > TOLERANCE_SECONDS:
        raise Rejected("the signed timestamp is more than 5 minutes away from now")
    try:
        key.verify(base64.b64decode(signature, validate=True), timestamp.encode("ascii") + request.body, _ECDSA)
    except (binascii.Error, ValueError, InvalidSignature):
        raise Rejected("the Event Webhook signature does not verify with this provider's public key") from None


def _text(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    return mask_text(str(value))[:limit]


def _occurred_at(event: Mapping[str, Any], now: datetime, index: int) -> datetime:
    """The event's `timestamp` (Unix seconds; now without one); Invalid (400 naming `[index].timestamp`)
    outside what OmniPost stores (core.validation.check_datetime_range)."""
    stamp = event.get("timestamp")
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        try:
            return datetime_from_timestamp(stamp)
        except ValueError as exc:
            raise Invalid(f"[{index}].timestamp", str(exc)) from None
    return now


def _canonical(event: Mapping[str, Any]) -> bytes:
    """The event's bytes for the hash that de-duplicates it when it has no `sg_event_id`."""
    try:
        return orjson.dumps(event, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits
        return json.dumps(event, sort_keys=True, separators=(",", ":")).encode()


def _receipt(event: Mapping[str, Any], name: str, now: datetime, index: int = 0) -> Receipt:
    kind = str(event.get("type") or "").lower()
    receipt: str | None = None
    bounce_type: str | None = None
    shown = name
    if name == "delivered":
        receipt = "delivered"
    elif name == "bounce":
        shown, receipt, bounce_type = "bounced", "bounced", ("soft" if kind in SOFT_BOUNCES else "hard")
    elif name == "dropped":
        receipt = "failed"
    elif name == "spamreport":
        shown, receipt = "complained", "complained"
    details = {f: _text(event[f]) for f in DETAIL_FIELDS if event.get(f) not in (None, "")}
    notification_id = event.get("notification_id")
    event_id = event.get("sg_event_id")
    return Receipt(
        notification_id=str(notification_id)[:MAX_ID_CHARS] if notification_id is not None else "",
        type=shown,
        occurred_at=_occurred_at(event, now, index),
        receipt=receipt,
        bounce_type=bounce_type,
        details=details,
        event_id=str(event_id)[:MAX_ID_CHARS] if isinstance(event_id, str | int) and event_id != "" else "",
        raw=_canonical(event),
    )


@adapter("sendgrid")
def parse(request: InboundRequest, provider: ProviderView, *, now: Callable[[], datetime] = _now) -> list[Receipt]:
    at = now()
    _verify(request, provider, at)
    try:
        events = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        try:  # orjson refuses integers beyond 64 bits; the standard library reads them
            events = json.loads(request.body)
        except ValueError:
            raise Rejected("the body is not JSON") from None
    if not isinstance(events, list) or len(events) > MAX_EVENTS:
        raise Rejected("the body is not a JSON array of events")
    receipts = []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise Rejected("an event is not a JSON object")
        name = event.get("event")
        if not isinstance(name, str) or not name:
            raise Rejected("an event has no `event` name")
        receipts.append(_receipt(event, name.lower()[:40], at, index))
    return receipts
