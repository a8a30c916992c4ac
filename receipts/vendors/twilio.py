"""Twilio status callbacks: `X-Twilio-Signature`, then `MessageStatus` into receipts.

Twilio signs each callback with HMAC-SHA1, keyed with the account's auth token, over the full URL
it was told (the provider's events URL with `?n=<notification id>`, see
providers.kinds.twilio) followed by the form fields sorted by name. The check is the
`twilio` package's own `RequestValidator`, which also tries the URL with and without the default
port, as Twilio's signers differ there (the URL exactly as received is tried first, with the same
package's `compute_signature` and `compare`: one HMAC instead of two for the callbacks that match it).

A callback carries no event id and no timestamp of its own: the event id is `MessageSid:MessageStatus`
(one event per state of a message, so a retried callback changes nothing), and `occurred_at` is the
time it arrived. Twilio's signature covers no time, so staleness does not apply.

| MessageStatus | receipt |
|---|---|
| delivered | delivered |
| undelivered | undelivered |
| failed | failed |
| queued, accepted, sending, sent, scheduled, read, canceled, ... | None (shown in `events` only) |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

from twilio.request_validator import RequestValidator, compare

from receipts.inbound import InboundRequest, ProviderView, Receipt, Rejected, adapter

SIGNATURE_HEADER = "X-Twilio-Signature"
RECEIPTS = {"delivered": "delivered", "undelivered": "undelivered", "failed": "failed"}
MAX_FIELD_CHARS = 64
# The carrier errors a status callback reports most (https://www.twilio.com/docs/api/errors),
# named in the event's details so an operator need not look them up.
ERROR_TEXTS = {
    30001: "queue overflow",
    30002: "account suspended",
    30003: "unreachable destination handset",
    30004: "message blocked",
    30005: "unknown destination handset",
    30006: "landline or unreachable carrier",
    30007: "message filtered by the carrier",
    30008: "unknown error",
    30009: "missing segment",
    30010: "message price exceeds max price",
    21610: "recipient unsubscribed (STOP)",
}


def _now() -> datetime:
    return datetime.now(UTC)


def _verified(request: InboundRequest, provider: ProviderView) -> bool:
    signature = request.headers.get(SIGNATURE_HEADER, "")
    if not signature:
        return False
    params = dict(request.form)
    for secrets in (provider.secrets, *provider.previous_secrets):
        token = secrets.get("auth_token") if secrets else None
        if not (isinstance(token, str) and token):
            continue
        validator = RequestValidator(token)
        # The URL as received first: it is one of the two forms `validate` signs (with and without
        # the port), and the one callbacks match, so one HMAC instead of two for them.
        if compare(validator.compute_signature(request.url, params), signature):
            return True
        if validator.validate(request.url, params, signature):
            return True
    return False


def _field(form: Mapping[str, str], *names: str) -> str:
    for name in names:
        value = form.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_FIELD_CHARS]
    return ""


@adapter("twilio")
def parse(request: InboundRequest, provider: ProviderView, *, now: Callable[[], datetime] = _now) -> list[Receipt]:
    if not _verified(request, provider):
        raise Rejected("X-Twilio-Signature does not verify with this provider's auth token")
    form = request.form
    account = _field(form, "AccountSid")
    if account and account != provider.config.get("account_sid"):
        raise Rejected("the callback names another Twilio account than this provider's")
    sid = _field(form, "MessageSid", "SmsSid")
    status = _field(form, "MessageStatus", "SmsStatus").lower()
    if not sid or not status:
        raise Rejected("not a message status callback: MessageSid and MessageStatus are required")
    notification_id = (parse_qs(urlsplit(request.url).query).get("n") or [""])[0]
    details: dict[str, object] = {"message_sid": sid}
    code_text = _field(form, "ErrorCode")
    if code_text:
        code: int | str = int(code_text) if code_text.isascii() and code_text.isdigit() else code_text
        details["error_code"] = code
        if isinstance(code, int) and code in ERROR_TEXTS:
            details["error_message"] = ERROR_TEXTS[code]
    return [
        Receipt(
            notification_id=notification_id,
            type=status,
            occurred_at=now(),
            receipt=RECEIPTS.get(status),
            details=details,
            event_id=f"{sid}:{status}",
            raw=request.body,
        )
    ]
