"""What the native push kinds (apns, fcm, webpush) share: a notification's push fields, the payload
each vendor is sent, and the vendors' size limits, checked when a notification is created (`check`)
so that a payload over a limit is a 400 naming the field, never a failure at the vendor.

Push fields (all optional): `data` (object of strings), `badge` (int), `sound`, `image_url`,
`action_url`, `collapse_key`, `ttl_seconds` (default 2,419,200: four weeks, the vendors' longest),
`urgency` (`high` | `normal`, default `high`); the notification's `subject` is the title and its
`body` the text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

PUSH_FIELDS = ("data", "badge", "sound", "image_url", "action_url", "collapse_key", "ttl_seconds", "urgency")
DEFAULT_TTL_SECONDS = 2_419_200
MAX_TTL_SECONDS = 2_419_200
MAX_DATA_BYTES = 4096
APNS_MAX_PAYLOAD = 4096
FCM_MAX_DATA = 4096
# RFC 8291 §4: a push message is one aes128gcm record of at most 4,096 bytes: a 86-byte header
# (salt 16, record size 4, key id length 1, the sender's key 65), the padding delimiter and the
# 16-byte tag around the plaintext.
WEBPUSH_MAX_RECORD = 4096
WEBPUSH_OVERHEAD = 86 + 1 + 16
MAX_COLLAPSE_KEY = 64  # apns-collapse-id's limit (bytes); FCM's and the Web Push Topic's are no larger
MAX_URL_CHARS = 2048
MAX_SOUND_CHARS = 256
DEVICE_KINDS = ("apns", "fcm", "webpush")

# The vendor's answers that mean the device will never take a push again: it is deactivated with this reason.
DEAD_TOKEN_REASONS = frozenset({
    "Unregistered", "BadDeviceToken", "DeviceTokenNotForTopic",  # APNs
    "UNREGISTERED", "INVALID_ARGUMENT",  # FCM (INVALID_ARGUMENT only when it is about the token)
    "http_404", "http_410",  # Web Push
})  # fmt: skip


@dataclass(slots=True)
class PushContent:
    title: str = ""
    body: str = ""
    data: dict[str, str] = field(default_factory=dict)
    badge: int | None = None
    sound: str | None = None
    image_url: str | None = None
    action_url: str | None = None
    collapse_key: str | None = None
    ttl_seconds: int = DEFAULT_TTL_SECONDS
    urgency: str = "high"

    @classmethod
    def of(cls, title: str, body: str, push: dict[str, Any] | None) -> PushContent:
        push = push or {}
        return cls(
            title=title or "", body=body or "", data=dict(push.get("data") or {}), badge=push.get("badge"),
            sound=push.get("sound"), image_url=push.get("image_url"), action_url=push.get("action_url"),
            collapse_key=push.get("collapse_key"), ttl_seconds=int(push.get("ttl_seconds", DEFAULT_TTL_SECONDS)),
            urgency=push.get("urgency") or "high",
        )  # fmt: skip


class Built:
    """What a provider builds from a notification's content, built once for all its devices: the
    dispatcher sends one push to a subscriber's devices with one subject, body and push dict, so the
    last (subject, body, push) seen, by identity, is the cache key. `build(content)` makes the value."""

    __slots__ = ("build", "key", "value")

    def __init__(self, build: Any) -> None:  # noqa: ANN401
        self.build = build
        self.key: tuple = (None, None, None)
        self.value: Any = None

    def of(self, subject: str, body: str, push: dict[str, Any] | None) -> Any:  # noqa: ANN401
        key = self.key
        if key[0] is subject and key[1] is body and key[2] is push and self.value is not None:
            return self.value
        value = self.build(PushContent.of(subject, body, push))
        self.key, self.value = (subject, body, push), value
        return value


def apns_payload(content: PushContent) -> bytes:
    """The APNs JSON payload: `aps` (alert title and body, badge, sound; mutable-content when there is
    an image, for the app's notification service extension) and the custom data keys beside it."""
    aps: dict[str, Any] = {"alert": {"title": content.title, "body": content.body}}
    if content.badge is not None:
        aps["badge"] = content.badge
    if content.sound:
        aps["sound"] = content.sound
    if content.image_url:
        aps["mutable-content"] = 1
    payload: dict[str, Any] = {**content.data, "aps": aps}
    if content.image_url:
        payload.setdefault("image_url", content.image_url)
    if content.action_url:
        payload.setdefault("action_url", content.action_url)
    return orjson.dumps(payload)


def fcm_message(content: PushContent, token: str) -> dict[str, Any]:
    """The FCM HTTP v1 `message` for one registration token."""
    notification: dict[str, Any] = {"title": content.title, "body": content.body}
    if content.image_url:
        notification["image"] = content.image_url
    android_notification: dict[str, Any] = {}
    if content.sound:
        android_notification["sound"] = content.sound
    if content.action_url:
        android_notification["click_action"] = content.action_url
    android: dict[str, Any] = {"ttl": f"{content.ttl_seconds}s",
                               "priority": "HIGH" if content.urgency == "high" else "NORMAL"}  # fmt: skip
    if content.collapse_key:
        android["collapse_key"] = content.collapse_key
    if android_notification:
        android["notification"] = android_notification
    apns_headers = {"apns-priority": "10" if content.urgency == "high" else "5"}
    if content.collapse_key:
        apns_headers["apns-collapse-id"] = content.collapse_key
    aps: dict[str, Any] = {}
    if content.badge is not None:
        aps["badge"] = content.badge
    if content.sound:
        aps["sound"] = content.sound
    message: dict[str, Any] = {"token": token, "notification": notification, "android": android,
                               "apns": {"headers": apns_headers, "payload": {"aps": aps}}}  # fmt: skip
    if content.data:
        message["data"] = content.data
    webpush: dict[str, Any] = {"headers": {"TTL": str(content.ttl_seconds), "Urgency": content.urgency}}
    if content.collapse_key:
        webpush["headers"]["Topic"] = content.collapse_key
    if content.action_url:
        webpush["fcm_options"] = {"link": content.action_url}
    message["webpush"] = webpush
    return message


_FCM_HEAD = b'{"message":{"token":'


def fcm_body_parts(content: PushContent) -> bytes:
    """The FCM request body without its token: what follows `{"message":{"token":` and the token's
    JSON string (`fcm_body`)."""
    whole = orjson.dumps({"message": fcm_message(content, "")})
    if not whole.startswith(_FCM_HEAD + b'""'):  # the token is the message's first key
        raise AssertionError("fcm_message must put the token first")
    return whole[len(_FCM_HEAD) + 2 :]


def fcm_body(rest: bytes, token: str) -> bytes:
    """The FCM request body for `token`: `{"message": fcm_message(content, token)}` as JSON."""
    return _FCM_HEAD + orjson.dumps(token) + rest


def webpush_plaintext(content: PushContent) -> bytes:
    """What a service worker's `push` event reads: JSON `{"title", "body", "data", …}` at the top level."""
    payload: dict[str, Any] = {"title": content.title, "body": content.body, "data": content.data}
    for name in ("badge", "sound", "image_url", "action_url"):
        value = getattr(content, name)
        if value is not None:
            payload[name] = value
    return orjson.dumps(payload)


def _json_size(value: Any) -> int:  # noqa: ANN401
    return len(orjson.dumps(value))


def check(push: dict[str, Any], title: str, body: str, kinds: tuple[str, ...] = DEVICE_KINDS) -> dict[str, list[str]]:
    """The push fields' problems (field → messages; empty when fine), the vendors' limits included
    for each of `kinds` the notification may go to. Over a limit, the field named is `data` when it
    has any, else `body`."""
    errors: dict[str, list[str]] = {}
    data = push.get("data")
    if data is not None:
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            errors["data"] = ["must be an object whose values are strings"]
        elif _json_size(data) > MAX_DATA_BYTES:
            errors["data"] = [f"must be at most {MAX_DATA_BYTES} bytes as compact JSON"]
        elif "aps" in data:
            errors["data"] = ["`aps` is APNs' own key and cannot be a data key"]
    badge = push.get("badge")
    if badge is not None and (isinstance(badge, bool) or not isinstance(badge, int) or not 0 <= badge <= 1_000_000):
        errors["badge"] = ["must be an integer from 0 to 1000000"]
    sound = push.get("sound")
    if sound is not None and (not isinstance(sound, str) or not 1 <= len(sound) <= MAX_SOUND_CHARS):
        errors["sound"] = [f"must be a sound name of 1 to {MAX_SOUND_CHARS} characters"]
    for name in ("image_url", "action_url"):
        url = push.get(name)
        if url is not None and (
            not isinstance(url, str) or not 1 <= len(url) <= MAX_URL_CHARS
            or not url.startswith(("https://", "http://")) or any(ch.isspace() for ch in url)
        ):  # fmt: skip
            errors[name] = [f"must be an http(s) URL of at most {MAX_URL_CHARS} characters"]
    collapse = push.get("collapse_key")
    if collapse is not None and (
        not isinstance(collapse, str) or not 1 <= len(collapse.encode()) <= MAX_COLLAPSE_KEY
        or not collapse.isprintable()
    ):  # fmt: skip
        errors["collapse_key"] = [f"must be 1 to {MAX_COLLAPSE_KEY} bytes of printable text"]
    ttl = push.get("ttl_seconds")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= MAX_TTL_SECONDS):
        errors["ttl_seconds"] = [f"must be an integer from 0 to {MAX_TTL_SECONDS}"]
    urgency = push.get("urgency")
    if urgency is not None and urgency not in ("high", "normal"):
        errors["urgency"] = ["must be high or normal"]
    if errors:
        return errors
    content = PushContent.of(title, body, push)
    over = "data" if content.data else "body"
    if "apns" in kinds and (size := len(apns_payload(content))) > APNS_MAX_PAYLOAD:
        errors.setdefault(over, []).append(f"the APNs payload would be {size} bytes; APNs takes at most "
                                           f"{APNS_MAX_PAYLOAD}")  # fmt: skip
    if "fcm" in kinds and content.data and (size := _json_size(content.data)) > FCM_MAX_DATA:
        errors.setdefault("data", []).append(f"FCM takes at most {FCM_MAX_DATA} bytes of data; this is {size}")
    if "webpush" in kinds:
        record = len(webpush_plaintext(content)) + WEBPUSH_OVERHEAD
        if record > WEBPUSH_MAX_RECORD:
            errors.setdefault(over, []).append(f"the Web Push record would be {record} bytes; push services take "
                                               f"at most {WEBPUSH_MAX_RECORD}")  # fmt: skip
    return errors


def finite_number(value: Any) -> bool:  # noqa: ANN401
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
