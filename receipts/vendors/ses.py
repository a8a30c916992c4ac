"""SES events through Amazon SNS HTTP(S) notifications.

Authentication is SNS's message signature, checked the way AWS documents it
(https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html):

- the canonical string is `Key\\nValue\\n` for each signed field, in this order, of the fields
  present: `Notification`: Message, MessageId, Subject (only when present), Timestamp, TopicArn, Type;
  `SubscriptionConfirmation` / `UnsubscribeConfirmation`: Message, MessageId, SubscribeURL,
  Timestamp, Token, TopicArn, Type;
- `SignatureVersion` 1 is SHA1withRSA, 2 is SHA256withRSA (PKCS #1 v1.5), `Signature` base64;
- the key is the one in the X.509 certificate at `SigningCertURL`, fetched only when the whole URL
  matches `settings.OMNIPOST_SNS_CERT_URL_PATTERN` (`re.fullmatch`), through the SSRF guard
  (`providers.transport.fetch`), and kept in a small in-process cache by URL.

A provider whose config names a `topic_arn` accepts only messages of that topic.
`SubscriptionConfirmation`: after its signature checks, the `SubscribeURL` is fetched (GET, through
the SSRF guard) when its scheme, host and port are those of the already-accepted `SigningCertURL`
(for AWS both are `https://sns.<region>.amazonaws.com`), and `Handled` is raised.
`Notification`: `Message` is an SES event (event publishing's `eventType`, or an identity
notification's `notificationType`): `Bounce` (`Permanent` → hard, `Transient`/`Undetermined` →
soft), `Complaint` → complained, `Delivery` → delivered; other event types are events without a
receipt. The notification id is the `notification_id` email tag (`mail.tags`) that
`providers.kinds.ses` sets, else its `X-OmniPost-Notification-Id` header in `mail.headers`, else
(no configuration set's tags, no original headers: an identity's notifications) the one whose send
through this provider SES answered with `mail.messageId` (the dispatcher stores it; looked up by
receipts.services within the receiving provider only); the event id is the SNS `MessageId`.
Recipient addresses in details are masked.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from django.conf import settings

from core.http import HttpError, split_url
from core.masking import mask_email, mask_text
from core.validation import check_datetime_range
from providers.kinds.base import provider_message_id
from providers.ssrf import DestinationForbidden
from providers.transport import fetch
from receipts.inbound import Handled, InboundRequest, Invalid, ProviderView, Receipt, Rejected, adapter

NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
SUBSCRIPTION_FIELDS = ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
SIGNED_FIELDS = {
    "Notification": NOTIFICATION_FIELDS,
    "SubscriptionConfirmation": SUBSCRIPTION_FIELDS,
    "UnsubscribeConfirmation": SUBSCRIPTION_FIELDS,
}
HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}
TAG_NAME = "notification_id"
HEADER_NAME = "x-omnipost-notification-id"
CERT_CACHE_SIZE = 32
CERT_CACHE_SECONDS = 24 * 3600.0
CERT_FETCH_TIMEOUT = 5.0
CERT_MAX_BYTES = 64 * 1024
CONFIRM_TIMEOUT = 10.0
MAX_DETAIL_CHARS = 500
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


class ConfirmationFailed(Exception):
    """The SubscribeURL could not be fetched: not answered `2xx` so SNS sends the confirmation again."""


class _CertificateCache:
    """Public keys of signing certificates by URL: bounded (LRU), expiring, thread-safe."""

    def __init__(self, size: int = CERT_CACHE_SIZE, ttl: float = CERT_CACHE_SECONDS) -> None:
        self.size, self.ttl = size, ttl
        self._keys: OrderedDict[str, tuple[float, rsa.RSAPublicKey]] = OrderedDict()
        self._lock = threading.Lock()
        self.fetches = 0  # how many certificates were fetched (tests read it)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()

    def public_key(self, url: str) -> rsa.RSAPublicKey:
        now = time.monotonic()
        with self._lock:
            hit = self._keys.get(url)
            if hit is not None and hit[0] > now:
                self._keys.move_to_end(url)
                return hit[1]
        key = _load_key(url)  # outside the lock: a slow fetch must not hold up other messages
        with self._lock:
            self.fetches += 1
            self._keys[url] = (now + self.ttl, key)
            self._keys.move_to_end(url)
            while len(self._keys) > self.size:
                self._keys.popitem(last=False)
        return key


CERTIFICATES = _CertificateCache()


def _load_key(url: str) -> rsa.RSAPublicKey:
    try:
        response = fetch(url, timeout=CERT_FETCH_TIMEOUT, max_body_bytes=CERT_MAX_BYTES)
    except (HttpError, DestinationForbidden, OSError, ValueError) as exc:
        raise Rejected(f"the signing certificate could not be fetched ({type(exc).__name__})") from None
    if response.status != 200 or response.truncated:
        raise Rejected(f"the signing certificate could not be fetched (HTTP {response.status})")
    try:
        certificate = x509.load_pem_x509_certificate(response.body)
    except ValueError:
        raise Rejected("the signing certificate is not a PEM X.509 certificate") from None
    now = datetime.now(UTC)
    if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
        raise Rejected("the signing certificate is not valid now")
    key = certificate.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise Rejected("the signing certificate does not hold an RSA key")
    return key


def canonical_string(message: Mapping[str, Any]) -> bytes:
    """The bytes SNS signs for this message (raises Rejected for an unknown Type or a bad field)."""
    names = SIGNED_FIELDS.get(message.get("Type"))  # type: ignore[arg-type]
    if names is None:
        raise Rejected("unknown SNS message type")
    parts = []
    for name in names:
        value = message.get(name)
        if value is None:
            if name == "Subject":  # optional, and signed only when present
                continue
            raise Rejected(f"the SNS message has no {name}")
        if not isinstance(value, str):
            raise Rejected(f"the SNS message's {name} is not a string")
        parts.append(f"{name}\n{value}\n")
    return "".join(parts).encode()


def verify_signature(message: Mapping[str, Any]) -> None:
    """Raise Rejected unless `message` carries a valid SNS signature (versions 1 and 2)."""
    algorithm = HASHES.get(message.get("SignatureVersion"))  # type: ignore[arg-type]
    if algorithm is None:
        raise Rejected("unsupported SNS SignatureVersion")
    cert_url = message.get("SigningCertURL")
    if not isinstance(cert_url, str) or not re.fullmatch(settings.OMNIPOST_SNS_CERT_URL_PATTERN, cert_url):
        raise Rejected("SigningCertURL is not an allowed SNS certificate URL")
    signature = message.get("Signature")
    if not isinstance(signature, str):
        raise Rejected("the SNS message is not signed")
    try:
        raw_signature = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise Rejected("the SNS signature is not base64") from None
    signed = canonical_string(message)
    key = CERTIFICATES.public_key(cert_url)
    try:
        key.verify(raw_signature, signed, padding.PKCS1v15(), algorithm())
    except InvalidSignature:
        raise Rejected("the SNS signature does not verify") from None


def _parse(request: InboundRequest) -> dict[str, Any]:
    try:
        message = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise Rejected("the body is not an SNS message (JSON)") from None
    if not isinstance(message, dict):
        raise Rejected("the body is not an SNS message (JSON object)")
    header_type = request.headers.get("x-amz-sns-message-type")
    if header_type is not None and header_type != message.get("Type"):
        raise Rejected("x-amz-sns-message-type does not match the message's Type")
    return message


def _confirm(message: Mapping[str, Any]) -> None:
    url = message.get("SubscribeURL")
    try:
        origin, _ = split_url(url if isinstance(url, str) else "")
        cert_origin, _ = split_url(message["SigningCertURL"])
    except ValueError:
        raise Rejected("SubscribeURL is not a usable URL") from None
    if origin.key != cert_origin.key:
        raise Rejected("SubscribeURL is not on the SNS host that signed the message")
    try:
        response = fetch(url, timeout=CONFIRM_TIMEOUT)  # type: ignore[arg-type]
    except (HttpError, DestinationForbidden, OSError) as exc:
        raise ConfirmationFailed(f"the subscription could not be confirmed ({type(exc).__name__})") from None
    if not 200 <= response.status < 300:
        raise ConfirmationFailed(f"the subscription could not be confirmed (HTTP {response.status})")


@adapter("ses")
def parse(request: InboundRequest, provider: ProviderView) -> list[Receipt]:
    message = _parse(request)
    verify_signature(message)
    topic = provider.config.get("topic_arn")
    if topic and message.get("TopicArn") != topic:
        raise Rejected("the SNS message is from another topic than the provider's topic_arn")
    kind = message["Type"]
    if kind == "SubscriptionConfirmation":
        _confirm(message)
        raise Handled("SNS subscription confirmed")
    if kind == "UnsubscribeConfirmation":
        raise Handled("SNS unsubscribe confirmation acknowledged")
    receipt = ses_receipt(message["Message"], event_id=message["MessageId"], sent_at=message["Timestamp"])
    if receipt is None:
        return []
    return [
        Receipt(
            notification_id=receipt.notification_id,
            type=receipt.type,
            occurred_at=receipt.occurred_at,
            receipt=receipt.receipt,
            bounce_type=receipt.bounce_type,
            details=receipt.details,
            event_id=receipt.event_id,
            raw=request.body,
            provider_message_id=receipt.provider_message_id,
        )
    ]


def ses_receipt(text: str, *, event_id: str, sent_at: str) -> Receipt | None:
    """The receipt an SES event (the JSON text of an SNS `Message`) carries; None if it is none."""
    try:
        event = json.loads(text)
    except ValueError:
        return None  # e.g. a test message published from the console
    if not isinstance(event, dict):
        return None
    event_type = event.get("eventType") or event.get("notificationType")
    if not isinstance(event_type, str) or not event_type:
        return None
    mail = event.get("mail") if isinstance(event.get("mail"), dict) else {}
    details: dict[str, Any] = {"ses_event_type": event_type}
    if isinstance(mail.get("messageId"), str):
        details["ses_message_id"] = mail["messageId"]
    receipt: str | None = None
    bounce_type: str | None = None
    when: object = None
    where = ""  # the field `when` came from, named in a 400
    if event_type == "Bounce":
        bounce = _obj(event.get("bounce"))
        receipt, kind = "bounced", "bounced"
        bounce_type = "hard" if bounce.get("bounceType") == "Permanent" else "soft"
        when, where = bounce.get("timestamp"), "Message.bounce.timestamp"
        details |= _pick(bounce, "bounceType", "bounceSubType", "feedbackId", "reportingMTA", "remoteMtaIp")
        details["bounce_type"] = bounce_type
        details["recipients"] = [
            _pick(r, "emailAddress", "action", "status", "diagnosticCode")
            for r in _objs(bounce.get("bouncedRecipients"))
        ]
    elif event_type == "Complaint":
        complaint = _obj(event.get("complaint"))
        receipt, kind = "complained", "complained"
        when, where = complaint.get("timestamp"), "Message.complaint.timestamp"
        details |= _pick(
            complaint, "complaintFeedbackType", "complaintSubType", "feedbackId", "userAgent", "arrivalDate"
        )
        details["recipients"] = [_pick(r, "emailAddress") for r in _objs(complaint.get("complainedRecipients"))]
    elif event_type == "Delivery":
        delivery = _obj(event.get("delivery"))
        receipt, kind = "delivered", "delivered"
        when, where = delivery.get("timestamp"), "Message.delivery.timestamp"
        details |= _pick(delivery, "smtpResponse", "reportingMTA", "processingTimeMillis", "remoteMtaIp")
        details["recipients"] = [mask_email(r) for r in delivery.get("recipients") or [] if isinstance(r, str)]
    else:  # Send, Reject, DeliveryDelay, Open, Click, RenderingFailure, Subscription: events, not receipts
        kind = _CAMEL.sub("_", event_type).lower()
        section = event_type[:1].lower() + event_type[1:]
        when, where = _obj(event.get(section)).get("timestamp"), f"Message.{section[:40]}.timestamp"
    notification_id = _notification_id(mail)
    return Receipt(
        notification_id=notification_id,
        type=kind,
        occurred_at=_when(when, where) or _when(sent_at, "Timestamp") or datetime.now(UTC),
        receipt=receipt,
        bounce_type=bounce_type,
        details=details,
        event_id=event_id,
        provider_message_id="" if notification_id else provider_message_id(mail.get("messageId")),
    )


def _notification_id(mail: Mapping[str, Any]) -> str:
    tags = mail.get("tags")
    if isinstance(tags, dict):
        values = tags.get(TAG_NAME)
        if isinstance(values, list) and values and isinstance(values[0], str):
            return values[0]
        if isinstance(values, str):
            return values
    for header in _objs(mail.get("headers")):
        if str(header.get("name", "")).lower() == HEADER_NAME and isinstance(header.get("value"), str):
            return header["value"].strip()
    return ""


def _when(value: object, field: str) -> datetime | None:
    """An ISO 8601 time (UTC when it states no offset); None if there is none to read, Invalid (400
    naming `field`) if it lies outside what OmniPost stores (core.validation.check_datetime_range)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    try:
        return check_datetime_range(parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC))
    except ValueError as exc:
        raise Invalid(field, str(exc)) from None


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _objs(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _pick(data: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """Selected fields in snake_case; addresses masked, free text scrubbed and bounded."""
    out: dict[str, Any] = {}
    for name in names:
        value = data.get(name)
        if value is None:
            continue
        key = _CAMEL.sub("_", name).lower()
        if isinstance(value, str):
            value = mask_email(value) if name == "emailAddress" else mask_text(value)[:MAX_DETAIL_CHARS]
        elif not isinstance(value, int | float | bool):
            continue
        out[key] = value
    return out
