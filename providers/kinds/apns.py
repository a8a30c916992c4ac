"""APNs provider: Apple Push Notification service over HTTP/2, token-based (a `.p8` key).

`POST {base_url}/3/device/{token}` on one multiplexed HTTP/2 connection per provider instance (so
per provider and dispatcher process: core.http.h2), many streams in flight, with
`authorization: bearer <ES256 JWT>` (`kid` = key_id, `iss` = team_id, `iat`): one provider token,
made afresh after 50 minutes (Apple refuses tokens older than an hour and more than one new token
every 20 minutes), and at once when APNs answers 403 ExpiredProviderToken, after which the send is
made again straight away: it uses no attempt. Headers `apns-topic`, `apns-push-type: alert`,
`apns-id` (the notification id), `apns-priority` (10 high, 5 normal), `apns-expiration` (now plus
`ttl_seconds`), `apns-collapse-id`.

Answers: 200 delivered; 410 (Unregistered), 400 BadDeviceToken and DeviceTokenNotForTopic
deactivate the device; 429 and 5xx are transient (Retry-After honoured); other 4xx permanent.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Callable
from typing import Any

import orjson

from core.http import Response, split_url
from core.http.h2 import H2Client, h2_ssl_context
from providers import jws, ssrf
from providers.kinds import push
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

DEFAULT_BASE_URL = "https://api.push.apple.com"
TIMEOUT_SECONDS = 15.0
TOKEN_REFRESH_SECONDS = 50 * 60  # within Apple's 20–60 minutes
TEAM_OR_KEY_ID = re.compile(r"[A-Z0-9]{10}")
TOPIC = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-_]{0,199}")
DEVICE_TOKEN = re.compile(r"(?:[0-9a-f]{2}){32,100}")
_DELIVERED = DeliveryResult(delivered=True, http_status=200)


class ApnsProvider(BaseProvider):
    kind = "apns"
    options = ("h2_client",)

    def __init__(self, config: dict, secrets: dict, *, h2_client: H2Client | None = None) -> None:
        super().__init__(config, secrets)
        self._key = jws.load_p256_private_key(self.secrets["private_key"])
        origin, _ = split_url(self.config.get("base_url") or DEFAULT_BASE_URL)
        context = h2_ssl_context(self.config.get("ca_file") or None)
        self._owns_client = h2_client is None
        self._client = h2_client or H2Client(origin, guard=ssrf.check_addresses, ssl_context=context,
                                             keep_headers=frozenset({b"retry-after"}))  # all _result reads
        self._topic = self.config["topic"].encode()
        self._built = push.Built(_built)  # a notification's payload and headers, once for its devices
        self._token = b""
        self._token_made = 0.0
        self.tokens_made = 0

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        config, secrets = as_dict(config, "config"), as_dict(secrets, "secrets")
        reject_unknown_keys(config, ("team_id", "key_id", "topic", "base_url", "ca_file"), section="config")
        reject_unknown_keys(secrets, ("private_key",), section="secrets")
        for name, what in (
            ("team_id", "the 10-character Team ID"),
            ("key_id", "the 10-character Key ID of the .p8 key"),
        ):
            if not isinstance(config.get(name), str) or not TEAM_OR_KEY_ID.fullmatch(config[name]):
                raise config_error(name, f"required: {what} (capital letters and digits)")
        topic = config.get("topic")
        if not isinstance(topic, str) or not TOPIC.fullmatch(topic):
            raise config_error("topic", "required: the app's bundle id, e.g. com.example.app")
        base_url = config.get("base_url") or DEFAULT_BASE_URL
        if not isinstance(base_url, str):
            raise config_error("base_url", "must be an https URL such as https://api.push.apple.com")
        base_url = base_url.rstrip("/")
        try:
            origin, target = split_url(base_url)
        except ValueError as exc:
            raise config_error("base_url", str(exc)) from None
        if origin.scheme != "https" or target != "/":
            raise config_error("base_url", "must be an https origin without a path, e.g. https://api.push.apple.com")
        ca_file = config.get("ca_file")
        if ca_file is not None:
            if not isinstance(ca_file, str) or not ca_file:
                raise config_error("ca_file", "must be the path of a PEM bundle of certificates to trust")
            try:
                ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError, ValueError):
                raise config_error("ca_file", "cannot be read as a PEM bundle of certificates") from None
        key = secrets.get("private_key")
        if not isinstance(key, str) or not key.strip():
            raise config_error("private_key", "required: the .p8 key's PEM text", section="secrets")
        try:
            jws.load_p256_private_key(key)
        except ValueError as exc:
            raise config_error("private_key", f"the .p8 key: {exc}", section="secrets") from None
        if check_destination:
            check_destination_host(origin.host, origin.port, "base_url")
        clean = {"team_id": config["team_id"], "key_id": config["key_id"], "topic": topic, "base_url": base_url}
        if ca_file is not None:
            clean["ca_file"] = ca_file
        return clean

    # --- the provider token ----------------------------------------------------------------------

    def provider_token(self, *, fresh: bool = False, replacing: bytes = b"") -> bytes:
        """The bearer token, made anew once it is TOKEN_REFRESH_SECONDS old, or when `fresh` and the
        token APNs refused (`replacing`) is still the current one (many sends that met the same
        ExpiredProviderToken make one new token between them)."""
        now = time.time()
        if (
            not self._token or now - self._token_made >= TOKEN_REFRESH_SECONDS
            or (fresh and replacing == self._token)
        ):  # fmt: skip
            claims = {"iss": self.config["team_id"], "iat": int(now)}
            self._token = b"bearer " + jws.es256(self._key, claims, kid=self.config["key_id"]).encode()
            self._token_made = now
            self.tokens_made += 1
        return self._token

    # --- sending ---------------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        future = asyncio.get_running_loop().create_future()
        handle = self.start_send(message, lambda result: future.done() or future.set_result(result))
        try:
            return await future
        except asyncio.CancelledError:
            handle.cancel()
            raise

    def start_send(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> Cancellable:
        try:
            token = message.recipient.strip().lower()
            if not DEVICE_TOKEN.fullmatch(token):
                result = DeliveryResult(delivered=False, error_code="invalid_recipient", permanent=True,
                                        message="not an APNs device token (hexadecimal)")  # fmt: skip
                return asyncio.get_running_loop().call_soon(on_result, result)
            body, priority, ttl_seconds, collapse = self._built.of(message.subject, message.body, message.push)
            if len(body) > push.APNS_MAX_PAYLOAD:
                result = DeliveryResult(
                    delivered=False,
                    error_code="malformed_content",
                    permanent=True,
                    message=f"payload of {len(body)} bytes over APNs' {push.APNS_MAX_PAYLOAD}",
                )
                return asyncio.get_running_loop().call_soon(on_result, result)
            headers = [
                (b"apns-topic", self._topic), (b"apns-push-type", b"alert"),
                (b"apns-id", message.notification_id.encode()),
                (b"apns-priority", priority),
                (b"apns-expiration", b"%d" % (int(time.time()) + ttl_seconds)),
                (b"content-type", b"application/json"),
            ]  # fmt: skip
            if collapse:
                headers.append((b"apns-collapse-id", collapse))
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            return asyncio.get_running_loop().call_soon(on_result, self._failure(exc))
        return _ApnsSend(self, f"/3/device/{token}", headers, body, on_result).start()

    def _result(self, response: Response) -> DeliveryResult:
        status = response.status
        if status == 200:
            return _DELIVERED
        reason = _reason(response.body)
        code = f"apns_{reason}" if reason else f"http_{status}"
        text = clean_message(f"HTTP {status} {reason}".strip(), self._secret_values())
        if status == 410 or reason in ("BadDeviceToken", "DeviceTokenNotForTopic", "Unregistered"):
            return DeliveryResult(delivered=False, http_status=status, error_code=code, message=text,
                                  permanent=True, deactivate=reason or "Unregistered")  # fmt: skip
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        transient = status == 429 or status >= 500
        return DeliveryResult(delivered=False, http_status=status, error_code=code, message=text,
                              retry_after=retry_after, permanent=None if transient else True)  # fmt: skip

    def _secret_values(self) -> list[str]:
        values = super()._secret_values()
        return [*values, self._token.decode()[7:]] if self._token else values

    def streams_in_flight(self) -> int:
        return self._client.in_flight

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


class _ApnsSend:
    """One send: its request, and once more with a new provider token after ExpiredProviderToken."""

    __slots__ = ("body", "handle", "headers", "on_result", "path", "provider", "renewed", "token")

    def __init__(self, provider: ApnsProvider, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                 on_result: Callable[[DeliveryResult], object]) -> None:  # fmt: skip
        self.provider = provider
        self.path = path
        self.headers = headers
        self.body = body
        self.on_result = on_result
        self.renewed = False
        self.token = b""
        self.handle: Any = None

    def start(self, *, fresh: bool = False) -> _ApnsSend:
        provider = self.provider
        try:
            self.token = provider.provider_token(fresh=fresh, replacing=self.token)
            self.handle = provider._client.start(
                "POST", self.path, [(b"authorization", self.token), *self.headers], self.body, TIMEOUT_SECONDS,
                self._done,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            self.handle = asyncio.get_running_loop().call_soon(self.on_result, provider._failure(exc))
        return self

    def _done(self, response: Response | None, error: BaseException | None) -> None:
        provider = self.provider
        try:
            if error is not None:
                result = provider._failure(error)
            elif response.status == 403 and _reason(response.body) == "ExpiredProviderToken" and not self.renewed:  # type: ignore[union-attr]
                self.renewed = True  # a new token and the same send again, now: no attempt is used
                self.start(fresh=True)
                return
            else:
                result = provider._result(response)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            result = provider._failure(exc)
        self.on_result(result)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()


def _built(content: push.PushContent) -> tuple[bytes, bytes, int, bytes]:
    """A notification's payload, apns-priority, time to live and apns-collapse-id (b"": none)."""
    return (push.apns_payload(content), b"10" if content.urgency == "high" else b"5", content.ttl_seconds,
            (content.collapse_key or "").encode())  # fmt: skip


def _reason(body: bytes) -> str:
    try:
        reason = orjson.loads(body).get("reason", "") if body else ""
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return reason if isinstance(reason, str) and reason.isalnum() and len(reason) <= 64 else ""
