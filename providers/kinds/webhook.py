"""Webhook provider: a JSON POST signed per the Standard Webhooks spec.

Headers: `webhook-id` (the notification id, constant across retries), `webhook-timestamp`,
`webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` keyed with the
base64-decoded part of the `whsec_` secret, and `Idempotency-Key` (the notification id again).
For OMNIPOST_SECRET_ROTATION_GRACE_SECONDS after the secret was rotated, the signature made with
the previous secret follows, space-separated (`v1,<new> v1,<old>`), as Standard Webhooks allows:
a receiver verifies whichever secret it has.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import re
import time
from collections.abc import Callable
from datetime import datetime

import orjson

from core.crypto import HmacSha256
from core.http import HttpClient, HttpConnectError, Response, build_head, split_url
from providers.kinds.base import (
    BaseProvider,
    Cancellable,
    DeliveryResult,
    OutboundMessage,
    as_dict,
    check_destination_host,
    clean_message,
    config_error,
    parse_retry_after,
    reject_unknown_keys,
)
from providers.transport import new_client

DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_TIMEOUT_SECONDS = 120.0
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 64


def _json(payload: dict) -> bytes:
    """Compact JSON, UTF-8; datetimes as `isoformat()` writes them (RFC 3339). orjson (≈ 20× faster
    than the standard library, which matters once per delivery, and it formats a datetime for
    ≈ 0.2 µs where isoformat() takes ≈ 1.6); the standard library only for what orjson refuses
    (integers beyond 64 bits)."""
    try:
        return orjson.dumps(payload)
    except TypeError:
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=_isoformat).encode()


def _isoformat(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_DELIVERED = {status: DeliveryResult(delivered=True, http_status=status) for status in range(200, 300)}  # frozen
_SAFE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
_KEY_FORMAT_HELP = 'expected "whsec_" followed by base64 of 16 to 64 random bytes, e.g. whsec_ + base64(os.urandom(32))'


def decode_signing_secret(secret: object) -> bytes:
    """The HMAC key inside a `whsec_` secret; ValueError with a fixable message if malformed."""
    if not isinstance(secret, str) or not secret.startswith("whsec_"):
        raise ValueError(_KEY_FORMAT_HELP)
    try:
        key = base64.b64decode(secret[len("whsec_") :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the part after whsec_ is not valid base64; {_KEY_FORMAT_HELP}") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"the key decodes to {len(key)} bytes; {_KEY_FORMAT_HELP}")
    return key


class WebhookProvider(BaseProvider):
    kind = "webhook"
    options = ("http_client", "previous_secrets", "previous_until")
    rotating_secrets = ("signing_secret",)

    def __init__(
        self,
        config: dict,
        secrets: dict,
        *,
        http_client: HttpClient | None = None,
        previous_secrets: dict | None = None,
        previous_until: float | None = None,
    ) -> None:
        """`http_client` may be shared by several providers; it is then not closed by aclose().
        `previous_secrets` (the rotated-out signing secret) also signs until `previous_until`
        (epoch seconds, `time.time()`), checked at each send."""
        super().__init__(config, secrets)
        self.url = self.config["url"]
        self.timeout = float(self.config.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)
        self._origin, target = split_url(self.url)
        # Static part of every request, serialised once.
        self._head_prefix = build_head(
            "POST", self._origin, target, {"Content-Type": "application/json", "Accept": "*/*"}, final=False
        )
        self._signer = HmacSha256(decode_signing_secret(self.secrets.get("signing_secret")))
        self._previous_secret = ""
        self._previous_signer: HmacSha256 | None = None
        self._previous_until = 0.0
        old = (previous_secrets or {}).get("signing_secret")
        if old and previous_until and old != self.secrets.get("signing_secret"):
            try:
                self._previous_signer = HmacSha256(decode_signing_secret(old))
            except ValueError:
                pass  # never valid (it was checked when saved): nothing to sign beside the new one
            else:
                self._previous_secret, self._previous_until = old, float(previous_until)
        self._owns_client = http_client is None
        self._client = http_client or new_client()

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        config, secrets = as_dict(config, "config"), as_dict(secrets, "secrets")
        reject_unknown_keys(config, ("url", "timeout_seconds"), section="config")
        reject_unknown_keys(secrets, ("signing_secret",), section="secrets")
        url = config.get("url")
        if not isinstance(url, str) or not url:
            raise config_error("url", "required: the http(s) URL to POST notifications to")
        try:
            origin, _ = split_url(url)
        except ValueError as exc:
            raise config_error("url", str(exc)) from None
        timeout = config.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
            raise config_error("timeout_seconds", "must be a number of seconds")
        if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
            raise config_error("timeout_seconds", f"must be greater than 0 and at most {MAX_TIMEOUT_SECONDS:g}")
        try:
            decode_signing_secret(secrets.get("signing_secret"))
        except ValueError as exc:
            raise config_error("signing_secret", str(exc), section="secrets") from None
        if check_destination:
            check_destination_host(origin.host, origin.port, "url")
        return {"url": url, "timeout_seconds": float(timeout)}

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        request = self._request(message)
        if isinstance(request, DeliveryResult):
            return request
        try:
            response = await self._client.send(self._origin, *request, self.timeout)
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            return self._failure(exc)
        return self._result(response)

    def start_send(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> Cancellable:
        return self._start(self._request(message), on_result)

    def start_post(self, msg_id: str, body: bytes, on_result: Callable[[DeliveryResult], object]) -> Cancellable:
        """POST `body` as given, signed as every send is, with `msg_id` as its `webhook-id` and
        `Idempotency-Key`: the event webhooks to tenants (dispatch.events) send through this, so an
        event's id is the same on every retry and a rotated secret signs beside the new one."""
        if not _SAFE_ID.fullmatch(msg_id):
            request: tuple[bytes, bytes] | DeliveryResult = DeliveryResult(
                delivered=False, error_code="malformed_content", message="invalid message id", permanent=True
            )
        else:
            try:
                request = self._signed_head(msg_id, body), body
            except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
                request = self._failure(exc)
        return self._start(request, on_result)

    def _start(
        self, request: tuple[bytes, bytes] | DeliveryResult, on_result: Callable[[DeliveryResult], object]
    ) -> Cancellable:
        if isinstance(request, DeliveryResult):
            return asyncio.get_running_loop().call_soon(on_result, request)

        try:
            return self._client.start(self._origin, *request, self.timeout, self._answered(on_result))
        except HttpConnectError as exc:  # a closed client, before the request is registered anywhere
            return asyncio.get_running_loop().call_soon(on_result, self._failure(exc))

    def _request(self, message: OutboundMessage) -> tuple[bytes, bytes] | DeliveryResult:
        """The signed request's head and body, or the permanent failure that keeps it from being sent."""
        try:
            msg_id = message.notification_id
            if not _SAFE_ID.fullmatch(msg_id):
                return DeliveryResult(
                    delivered=False, error_code="malformed_content", message="invalid notification id", permanent=True
                )
            payload = {
                "id": msg_id,
                "channel": message.channel,
                "recipient": message.recipient,
                "subject": message.subject,
                "body": message.body,
                "metadata": message.metadata,
                "created_at": message.created_at,  # formatted by _json
            }
            try:
                body = _json(payload)
            except (TypeError, ValueError) as exc:
                return DeliveryResult(
                    delivered=False,
                    error_code="malformed_content",
                    error_class=type(exc).__name__,
                    message=clean_message(f"payload is not JSON-serialisable: {exc}"),
                    permanent=True,
                )
            head = self._signed_head(msg_id, body, message.traceparent)
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            return self._failure(exc)
        return head, body

    def _signed_head(self, msg_id: str, body: bytes, traceparent: str = "") -> bytes:
        """The request head with the Standard Webhooks headers for `body` sent as `msg_id` (and the
        W3C `traceparent` of the send, where traces are exported)."""
        now = time.time()
        timestamp = str(int(now))
        signed = f"{msg_id}.{timestamp}.".encode()
        signature = b"v1," + base64.b64encode(self._signer.digest(signed, body))
        if self._previous_signer is not None and now < self._previous_until:  # a rotation's grace
            signature += b" v1," + base64.b64encode(self._previous_signer.digest(signed, body))
        return b"%swebhook-id: %s\r\nwebhook-timestamp: %s\r\nwebhook-signature: %s\r\n" % (
            self._head_prefix,
            msg_id.encode(),
            timestamp.encode(),
            signature,
        ) + b"Idempotency-Key: %s\r\n%sContent-Length: %d\r\n\r\n" % (
            msg_id.encode(),
            b"traceparent: %s\r\n" % traceparent.encode() if traceparent else b"",
            len(body),
        )

    def _result(self, response: Response) -> DeliveryResult:
        status = response.status
        if 200 <= status < 300:
            return _DELIVERED[status]
        if 300 <= status < 400:
            return DeliveryResult(
                delivered=False,
                http_status=status,
                error_code="redirect",
                message=f"HTTP {status}: redirects are not followed; configure the final URL",
                permanent=True,
            )
        return DeliveryResult(
            delivered=False,
            http_status=status,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            error_code=f"http_{status}",
            message=clean_message(
                f"HTTP {status} {response.reason}: {response.body[:200].decode('utf-8', 'replace')}".strip(),
                self._secret_values(),
            ),
        )

    def _secret_values(self) -> list[str]:
        values = super()._secret_values()
        return [*values, self._previous_secret] if self._previous_secret else values

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
