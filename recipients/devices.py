"""A subscriber's push devices: FCM and APNs tokens and Web Push subscriptions.

- `clean_registration(body)` checks a `POST subscribers/{external_id}/devices` body and returns the
  device's kind, the value stored encrypted (the token, or the subscription's JSON) and its identity
  (the token, or the subscription's endpoint), whose keyed blind index (`core.crypto.blind_index`, as
  the suppression list's) makes one device per token per tenant without decrypting the table.
- `register()` stores it in one upsert: the same token (or endpoint) again finds the device there is,
  moved to this subscriber and active again (an app registers the token it has; re-registering a
  token the vendor once refused means the app was given it anew); `delete()` removes one.
- `deactivate_sql()` is the statement fragment that marks devices dead, which the dispatcher's record
  statement composes (the vendor said the token is gone: never sent to again).
- Web Push endpoints are held to the SSRF rules at registration through the check a higher layer
  hands in (`check_endpoint_with`: the providers' guard, which this room does not import), and again
  at connect time by the sending provider.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connections, transaction

from core import crypto
from core.fields import Ciphertext
from core.ids import uuid7
from core.models import AuditEvent
from core.validation import MAX_TOKEN_CHARS, FieldErrors, unknown_fields
from recipients.models import Device, DeviceKind, Subscriber

REGISTRATION_FIELDS = ("kind", "token", "subscription")
SUBSCRIPTION_FIELDS = ("endpoint", "keys", "expirationTime")
APNS_TOKEN = re.compile(r"(?:[0-9a-fA-F]{2}){32,100}")
FCM_TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")
MAX_ENDPOINT_CHARS = 2048

# The endpoint check a higher layer hands in (notifications.apps: the providers' SSRF guard):
# check(host, port) raises ValueError with a message a tenant can act on.
_check_endpoint: Callable[[str, int], None] | None = None


def check_endpoint_with(check: Callable[[str, int], None]) -> None:
    global _check_endpoint
    _check_endpoint = check


@dataclass(frozen=True, slots=True)
class Registration:
    kind: str
    stored: str  # what is encrypted: the token, or the subscription as compact JSON
    identity: str  # what the blind index is over: the token, or the subscription's endpoint
    masked: str


def b64url_decode(value: str) -> bytes:
    """Base64url with or without its padding (RFC 8291's keys come without); ValueError if not."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_-]+={0,2}", value):
        raise ValueError("must be base64url")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("must be base64url") from None


def mask_token(token: str) -> str:
    """At most a quarter of the token shows (its end, at most 4 characters)."""
    shown = min(4, len(token) // 4)
    return "****" + (token[-shown:] if shown else "")


def mask_endpoint(endpoint: str) -> str:
    """The endpoint's origin only: its path is the subscription's secret address."""
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.hostname or ''}/****"[:200]


def parse_subscription(value: Any) -> dict[str, Any]:
    """A Web Push subscription (`{"endpoint", "keys": {"p256dh", "auth"}}`, as PushManager gives
    it) checked and in its stored form; FieldErrors naming the part that is wrong. The endpoint's
    destination is checked too (SSRF rules)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise FieldErrors({"subscription": ["must be a Web Push subscription's JSON"]}) from None
    if not isinstance(value, dict):
        raise FieldErrors({"subscription": ['must be an object {"endpoint": "https://…", "keys": {…}}']})
    errors: dict[str, list[str]] = {
        f"subscription.{k}": v for k, v in unknown_fields(value, SUBSCRIPTION_FIELDS).items()
    }
    endpoint = value.get("endpoint")
    if not isinstance(endpoint, str) or not 1 <= len(endpoint) <= MAX_ENDPOINT_CHARS:
        errors["subscription.endpoint"] = [
            f"required: the push service's https URL (≤ {MAX_ENDPOINT_CHARS} characters)"
        ]
    else:
        problem = _endpoint_problem(endpoint)
        if problem:
            errors["subscription.endpoint"] = [problem]
    keys = value.get("keys")
    if not isinstance(keys, dict):
        errors["subscription.keys"] = ['required: {"p256dh": "<base64url>", "auth": "<base64url>"}']
        keys = {}
    else:
        errors.update({f"subscription.keys.{k}": v for k, v in unknown_fields(keys, ("p256dh", "auth")).items()})
    try:
        point = b64url_decode(keys.get("p256dh"))
        if len(point) != 65 or point[0] != 4:
            raise ValueError
        from cryptography.hazmat.primitives.asymmetric import ec

        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
    except (ValueError, TypeError):
        if keys:
            errors["subscription.keys.p256dh"] = ["must be the base64url of an uncompressed P-256 point (65 bytes)"]
    try:
        if len(b64url_decode(keys.get("auth"))) != 16:
            raise ValueError
    except (ValueError, TypeError):
        if keys:
            errors["subscription.keys.auth"] = ["must be the base64url of the 16-byte authentication secret"]
    if errors:
        raise FieldErrors(errors)
    return {"endpoint": endpoint, "keys": {"p256dh": keys["p256dh"].rstrip("="), "auth": keys["auth"].rstrip("=")}}


def _endpoint_problem(endpoint: str) -> str:
    if any(ch.isspace() or ord(ch) < 32 for ch in endpoint):
        return "must not contain whitespace or control characters"
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return "must be an https URL"
    allowed = ("https", "http") if settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS else ("https",)
    if parts.scheme not in allowed or not parts.hostname:
        return "must be an https URL"
    if parts.username is not None or parts.password is not None:
        return "must not contain credentials"
    if _check_endpoint is not None:
        try:
            _check_endpoint(parts.hostname, port or (443 if parts.scheme == "https" else 80))
        except ValueError as exc:
            return str(exc)
    return ""


def clean_token(kind: str, token: Any) -> str:
    """An FCM registration token or an APNs device token, checked (APNs: hex, lower-cased)."""
    if not isinstance(token, str):
        raise ValueError("required: the device token, a string")
    if kind == DeviceKind.APNS:
        if not APNS_TOKEN.fullmatch(token):
            raise ValueError("must be an APNs device token: an even number (64 or more) of hexadecimal digits")
        return token.lower()
    if not FCM_TOKEN.fullmatch(token):
        raise ValueError(f"must be an FCM registration token: 1 to {MAX_TOKEN_CHARS} printable characters, no spaces")
    return token


def clean_registration(body: Any) -> Registration:
    if not isinstance(body, dict):
        raise FieldErrors({"non_field_errors": ["the body must be a JSON object"]})
    errors = unknown_fields(body, REGISTRATION_FIELDS)
    kind = body.get("kind")
    if kind not in DeviceKind.values:
        errors["kind"] = [f"required: one of {', '.join(DeviceKind.values)}"]
        raise FieldErrors(errors)
    if kind == DeviceKind.WEBPUSH:
        if "token" in body:
            errors["token"] = ["a webpush device is given as `subscription`, not `token`"]
        try:
            subscription = parse_subscription(body.get("subscription"))
        except FieldErrors as exc:
            errors.update(exc.errors)
        if errors:
            raise FieldErrors(errors)
        endpoint = subscription["endpoint"]
        return Registration(kind, json.dumps(subscription, separators=(",", ":")), endpoint, mask_endpoint(endpoint))
    if "subscription" in body:
        errors["subscription"] = [f"only for webpush; a {kind} device is given as `token`"]
    try:
        token = clean_token(kind, body.get("token"))
    except ValueError as exc:
        errors["token"] = [str(exc)]
    if errors:
        raise FieldErrors(errors)
    return Registration(kind, token, token, mask_token(token))


def identity_of(kind: str, recipient: str) -> str:
    """The identity (what the blind index is over) of a push `recipient` of `kind` that was checked at
    its notification's creation (`recipient_identity`): no check again, no look-up of the endpoint's
    host (the dispatcher's loop calls it)."""
    if kind == DeviceKind.WEBPUSH:
        return str(json.loads(recipient)["endpoint"])
    return recipient.lower() if kind == DeviceKind.APNS else recipient


def recipient_identity(kind: str, recipient: str) -> str:
    """The identity of a push `recipient` (a token, or a subscription's JSON) for `kind`."""
    if kind == DeviceKind.WEBPUSH:
        return str(parse_subscription(recipient)["endpoint"])
    return clean_token(kind, recipient)


# --- storing --------------------------------------------------------------------------------------

_REINDEX = "UPDATE devices SET token_index = %s WHERE tenant_id = %s AND token_index = ANY(%s)"
_UPSERT = """INSERT INTO devices (id, tenant_id, subscriber_id, kind, token, token_masked, token_index, active,
                     deactivated_reason, created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, true, NULL, now())
ON CONFLICT (tenant_id, token_index) DO UPDATE
SET subscriber_id = EXCLUDED.subscriber_id, kind = EXCLUDED.kind, token = EXCLUDED.token,
    token_masked = EXCLUDED.token_masked, active = true, deactivated_reason = NULL
RETURNING id, (xmax = 0)"""


def register(subscriber: Subscriber, registration: Registration, *, actor: str) -> tuple[Device, bool]:
    """Store the device for `subscriber`: (device, created). A token (endpoint) the tenant has already
    is that device, moved here if another subscriber had it, and active again."""
    found = crypto.blind_indexes(registration.identity)
    token = Device._meta.get_field("token").get_prep_value(registration.stored)
    connection = connections[Device.objects.db]
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        if len(found) > 1:  # a row indexed under an older key (before rotate_encryption_keys) is this one
            cursor.execute(_REINDEX, [found[0], subscriber.tenant_id, list(found[1:])])
        cursor.execute(_UPSERT, [uuid7(), subscriber.tenant_id, subscriber.pk, registration.kind, token,
                                 registration.masked, found[0]])  # fmt: skip
        device_id, created = cursor.fetchone()
        AuditEvent.record(
            actor=actor, action="device.registered" if created else "device.reregistered",
            target_type="recipients.device", target_id=device_id, tenant=subscriber.tenant_id,
            details={"subscriber": subscriber.external_id, "kind": registration.kind,
                     "token_masked": registration.masked},
        )  # fmt: skip
    return Device.objects.defer("token").get(pk=device_id), bool(created)


def delete(subscriber: Subscriber, device_id: uuid.UUID, *, actor: str) -> bool:
    with transaction.atomic():
        deleted, _ = Device.objects.for_tenant(subscriber.tenant_id).filter(
            subscriber=subscriber, pk=device_id).delete()  # fmt: skip
        if deleted:
            AuditEvent.record(actor=actor, action="device.deleted", target_type="recipients.device",
                              target_id=device_id, tenant=subscriber.tenant_id,
                              details={"subscriber": subscriber.external_id})  # fmt: skip
    return bool(deleted)


def opened(device: Device) -> str:
    """The stored value in clear (a token, or the subscription's JSON)."""
    value = device.__dict__.get("token")
    if isinstance(value, Ciphertext):
        return crypto.decrypt(value, where=f"Device.token of row {device.pk}")
    return device.token


# --- dead devices: a fragment of the dispatcher's record statement --------------------------------


def deactivate_sql(source: str) -> str:
    """A data-modifying statement for a WITH clause: the devices `source` names (columns `device_id`
    uuid, `reason` text) become inactive with their reason, unless already; returns what changed
    (`id`, `tenant_id`, `subscriber_id`, `kind`, `deactivated_reason`), for the event each one emits."""
    return f"""UPDATE devices d SET active = false, deactivated_reason = s.reason
        FROM (SELECT DISTINCT ON (device_id) device_id, reason FROM {source} WHERE reason IS NOT NULL) s
        WHERE d.id = s.device_id AND d.active
        RETURNING d.id, d.tenant_id, d.subscriber_id, d.kind, d.deactivated_reason"""  # noqa: S608


def by_token_sql(values: str) -> str:
    """A query (for a WITH clause) of the devices whose token a push to a raw `recipient` went to:
    `values` has columns tenant_id, kind, token_index (one row per key of `crypto.blind_indexes`),
    reason, and the rows named come back as (`device_id`, `reason`) for `deactivate_sql`."""
    return f"""SELECT d.id AS device_id, v.reason FROM {values} v
        JOIN devices d ON d.tenant_id = v.tenant_id AND d.token_index = v.token_index AND d.kind = v.kind"""  # noqa: S608


def used_sql(source: str) -> str:
    """A data-modifying statement: the devices of `source` (columns `device_id`, `status`) whose status
    is `delivered` were delivered to now."""
    return f"""UPDATE devices d SET last_used_at = now()
        FROM (SELECT DISTINCT device_id FROM {source} WHERE status = 'delivered') s WHERE d.id = s.device_id
        RETURNING d.id"""  # noqa: S608
