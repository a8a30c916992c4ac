"""`webhook` kind: events the receiver posts back, signed per Standard Webhooks with the provider's
own `whsec_` secret (the one OmniPost signs its sends with), verified by the `standardwebhooks`
package (which also refuses a `webhook-timestamp` more than 5 minutes off).

    POST /hooks/providers/{id}
    webhook-id: <the receiver's event id>        (the de-duplication key)
    webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">

    {"type": "delivered" | "bounced" | "complained" | "failed",
     "notification_id": "<the webhook-id OmniPost sent>",
     "occurred_at": "<ISO 8601 with offset, 1970-01-01..9999-12-30 UTC; default: webhook-timestamp>",
     "details": {"bounce_type": "hard" | "soft", ...}}

During a secret rotation's grace period (OMNIPOST_SECRET_ROTATION_GRACE_SECONDS) an event signed
with the previous secret verifies too. Details are kept up to MAX_DETAILS_BYTES of JSON (masked);
larger ones are replaced by `{"truncated": true}`.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache

import orjson
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from core.validation import datetime_from_timestamp, parse_aware_datetime
from receipts.inbound import BOUNCE_TYPES, InboundRequest, Invalid, ProviderView, Receipt, Rejected, adapter

TYPES = ("delivered", "bounced", "complained", "failed")
MAX_DETAILS_BYTES = 8 * 1024
MAX_EVENT_ID = 200


def _secrets(provider: ProviderView) -> list[str]:
    found = [provider.secrets.get("signing_secret")]
    found += [previous.get("signing_secret") for previous in provider.previous_secrets]
    return [s for s in dict.fromkeys(found) if isinstance(s, str) and s]


@lru_cache(maxsize=1024)
def _verifier(secret: str) -> Webhook:
    """One verifier per secret: the package base64-decodes the secret when it builds one, not per verify."""
    return Webhook(secret)


def _verify(request: InboundRequest, provider: ProviderView) -> None:
    headers = {name: request.headers.get(name, "") for name in ("webhook-id", "webhook-timestamp", "webhook-signature")}
    problem = "no signing secret"
    for secret in _secrets(provider):
        try:
            _verifier(secret).verify(request.body, headers, json_parse=False)
            return
        except WebhookVerificationError as exc:
            problem = str(exc)
            if "timestamp" in problem.lower() or "headers" in problem.lower():
                break  # the same for every secret
        except (ValueError, TypeError, UnicodeDecodeError):  # malformed signature header, base64 or body
            problem = "malformed signature headers or body"
            break
    raise Rejected(f"Standard Webhooks verification failed: {problem}")


def _occurred_at(value: object, fallback: str) -> datetime:
    """`occurred_at` (core.validation's parse and range: 400 naming it otherwise), or the signed
    webhook-timestamp (within 5 minutes of now: the signature check saw to that)."""
    if value is None:
        try:
            return datetime_from_timestamp(int(fallback))
        except (TypeError, ValueError):
            raise Rejected("webhook-timestamp is not a number") from None
    try:
        return parse_aware_datetime(value)
    except ValueError as exc:
        raise Invalid("occurred_at", str(exc)) from None


@adapter("webhook")
def parse(request: InboundRequest, provider: ProviderView) -> list[Receipt]:
    _verify(request, provider)
    try:
        event = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        raise Rejected("the body is not JSON") from None
    if not isinstance(event, dict):
        raise Rejected("the body must be a JSON object")
    kind = event.get("type")
    if kind not in TYPES:
        raise Rejected(f"type must be one of {', '.join(TYPES)}")
    notification_id = event.get("notification_id")
    if not isinstance(notification_id, str) or not notification_id:
        raise Rejected("notification_id is required")
    details = event.get("details") or {}
    if not isinstance(details, dict):
        raise Rejected("details must be a JSON object")
    bounce_type = details.get("bounce_type") if kind == "bounced" else None
    if bounce_type is not None and bounce_type not in BOUNCE_TYPES:
        raise Rejected(f"details.bounce_type must be one of {', '.join(BOUNCE_TYPES)}")
    if len(orjson.dumps(details)) > MAX_DETAILS_BYTES:
        details = {"truncated": True}
    event_id = str(request.headers.get("webhook-id", ""))[:MAX_EVENT_ID]
    return [
        Receipt(
            notification_id=notification_id[:64], type=kind, receipt=kind, bounce_type=bounce_type, details=details,
            occurred_at=_occurred_at(event.get("occurred_at"), request.headers.get("webhook-timestamp", "")),
            event_id=event_id, raw=request.body,
        )
    ]
