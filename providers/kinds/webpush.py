"""Web Push provider: RFC 8030 delivery to a browser's push service, the message encrypted per
RFC 8291 and the sender identified per RFC 8292 (VAPID), with `cryptography` directly.

The recipient is the subscription (its JSON: `endpoint`, `keys.p256dh`, `keys.auth`). Each send:
- encrypts the plaintext (JSON `{"title", "body", "data", …}`) as one `aes128gcm` record (RFC 8188):
  a new P-256 key pair and salt per message, ECDH with the subscription's key, HKDF with its auth
  secret (RFC 8291 §3.4), AES-128-GCM with the padding delimiter 0x02;
- signs `Authorization: vapid t=<JWT>, k=<public key>`: an ES256 JWT with `aud` = the endpoint's
  origin, `exp` 12 hours ahead (RFC 8292 allows 24), `sub` = the provider's `subject`; one JWT per
  origin, reused until an hour before it expires;
- POSTs through the HTTP client the other HTTP kinds use, so the endpoint is held to the SSRF rules
  on the addresses it connects to; headers `TTL`, `Urgency`, `Topic` (the collapse key when it is
  a valid topic, ≤ 32 base64url characters, else a digest of it), `Content-Encoding: aes128gcm`.

Why not pywebpush: it sends with `requests` (synchronous I/O, which the dispatcher's event loop must
never wait on) and makes a new VAPID signature per request; `http_ece` and `py_vapid` bring nothing
that the few lines of `cryptography` below do not, and tests decrypt with `http_ece` to hold this
to it.

Answers: 2xx delivered; 404 and 410 deactivate the subscription; 429 and 5xx are transient
(Retry-After honoured); 413 and other 4xx permanent; redirects are not followed.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from collections.abc import Callable
from typing import Any

import orjson
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from core.http import HttpClient, HttpConnectError, Response, build_head, split_url
from providers import jws, ssrf
from providers.kinds import push
from providers.kinds.base import (
    BaseProvider,
    Cancellable,
    DeliveryResult,
    OutboundMessage,
    as_dict,
    clean_message,
    config_error,
    parse_retry_after,
    reject_unknown_keys,
)
from providers.transport import new_client

TIMEOUT_SECONDS = 15.0
RECORD_SIZE = 4096
VAPID_SECONDS = 12 * 3600
VAPID_RENEW_BEFORE = 3600
_TOPIC = re.compile(r"[A-Za-z0-9_-]{1,32}")


def encrypt(plaintext: bytes, p256dh: bytes, auth: bytes, *, salt: bytes | None = None,
            sender: ec.EllipticCurvePrivateKey | None = None) -> bytes:  # fmt: skip
    """The aes128gcm body of one push message for the subscription keys `p256dh` (65-byte point) and
    `auth` (16 bytes): header (salt, record size, the sender's public key) and one record."""
    receiver = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), p256dh)
    sender = sender or ec.generate_private_key(ec.SECP256R1())
    sender_public = jws.uncompressed_point(sender.public_key())
    shared = sender.exchange(ec.ECDH(), receiver)
    ikm = HKDF(hashes.SHA256(), 32, auth, b"WebPush: info\x00" + p256dh + sender_public).derive(shared)
    salt = salt or os.urandom(16)
    cek = HKDF(hashes.SHA256(), 16, salt, b"Content-Encoding: aes128gcm\x00").derive(ikm)
    nonce = HKDF(hashes.SHA256(), 12, salt, b"Content-Encoding: nonce\x00").derive(ikm)
    record = AESGCM(cek).encrypt(nonce, plaintext + b"\x02", None)
    return salt + RECORD_SIZE.to_bytes(4, "big") + bytes((len(sender_public),)) + sender_public + record


def parse_subscription(text: str) -> tuple[str, bytes, bytes]:
    """(endpoint, p256dh, auth) of a subscription's JSON; ValueError if it is not one."""
    subscription = orjson.loads(text)
    endpoint = subscription["endpoint"]
    keys = subscription["keys"]
    p256dh, auth = jws.b64url_decode(keys["p256dh"]), jws.b64url_decode(keys["auth"])
    if not isinstance(endpoint, str) or len(p256dh) != 65 or len(auth) != 16:
        raise ValueError("not a Web Push subscription")
    return endpoint, p256dh, auth


def topic_for(collapse_key: str) -> str:
    """RFC 8030's Topic is at most 32 base64url characters: the collapse key when it is one, else a
    digest of it (the same key, the same topic)."""
    if _TOPIC.fullmatch(collapse_key):
        return collapse_key
    return jws.b64url(hashlib.sha256(collapse_key.encode()).digest())[:32]


class WebpushProvider(BaseProvider):
    kind = "webpush"
    options = ("http_client",)

    def __init__(self, config: dict, secrets: dict, *, http_client: HttpClient | None = None) -> None:
        super().__init__(config, secrets)
        self._key = jws.load_p256_private_key(self.secrets["vapid_private_key"])
        self._public = self.config["vapid_public_key"]
        self._owns_client = http_client is None
        self._client = http_client or new_client()
        self._vapid: dict[tuple[str, str, int], tuple[str, float]] = {}  # origin → (header value, renew at)
        self.vapid_signed = 0

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        config, secrets = as_dict(config, "config"), as_dict(secrets, "secrets")
        reject_unknown_keys(config, ("subject", "vapid_public_key"), section="config")
        reject_unknown_keys(secrets, ("vapid_private_key",), section="secrets")
        subject = config.get("subject")
        if not isinstance(subject, str) or not re.fullmatch(r"(mailto:[^\s@]+@[^\s@]+|https://[^\s]+)", subject):
            raise config_error(
                "subject", "required: a mailto: address or an https: URL the push service can reach you at"
            )
        public = config.get("vapid_public_key")
        try:
            point = jws.b64url_decode(public) if isinstance(public, str) else b""
            ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
            if len(point) != 65:
                raise ValueError
        except (ValueError, TypeError):
            raise config_error("vapid_public_key", "required: the base64url of the uncompressed P-256 public key "
                               "(65 bytes)") from None  # fmt: skip
        private = secrets.get("vapid_private_key")
        if not isinstance(private, str) or not private.strip():
            raise config_error("vapid_private_key", "required: the base64url raw P-256 private key, or its PEM",
                               section="secrets")  # fmt: skip
        try:
            key = jws.load_p256_private_key(private)
        except ValueError as exc:
            raise config_error("vapid_private_key", str(exc), section="secrets") from None
        if jws.uncompressed_point(key.public_key()) != point:
            raise config_error("vapid_private_key", "is not the private half of vapid_public_key", section="secrets")
        return {"subject": subject, "vapid_public_key": jws.b64url(point)}

    def vapid_header(self, origin: Any) -> str:  # noqa: ANN401 - a core.http Origin
        """`vapid t=…, k=…` for the endpoint's origin, signed once and reused until an hour before it expires."""
        now = time.time()
        cached = self._vapid.get(origin.key)
        if cached is not None and now < cached[1]:
            return cached[0]
        audience = f"{origin.scheme}://{origin.host_header.decode()}"  # the Host header: the port where not the default
        claims = {"aud": audience, "exp": int(now) + VAPID_SECONDS, "sub": self.config["subject"]}
        value = f"vapid t={jws.es256(self._key, claims)}, k={self._public}"
        if len(self._vapid) >= 1024:  # endpoints of many push services: keep the cache bounded
            self._vapid.clear()
        self._vapid[origin.key] = (value, now + VAPID_SECONDS - VAPID_RENEW_BEFORE)
        self.vapid_signed += 1
        return value

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        try:
            request = self._request(message)
            if isinstance(request, DeliveryResult):
                return request
            response = await self._client.send(*request, TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            return self._failure(exc)
        return self._result(response)

    def start_send(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> Cancellable:
        """`send` without a task, coroutine or future (the dispatcher's hot path): the request starts
        now and its answer calls back, on the event loop, never from within this call."""
        loop = asyncio.get_running_loop()
        try:
            request = self._request(message)
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            request = self._failure(exc)
        if isinstance(request, DeliveryResult):
            return loop.call_soon(on_result, request)
        try:
            return self._client.start(*request, TIMEOUT_SECONDS, self._answered(on_result))
        except HttpConnectError as exc:  # a closed client, before the request is registered anywhere
            return loop.call_soon(on_result, self._failure(exc))

    def _request(self, message: OutboundMessage) -> tuple[Any, bytes, bytes] | DeliveryResult:
        """(origin, head, body) of the encrypted push message, or the permanent failure that keeps it
        from being sent."""
        try:
            endpoint, p256dh, auth = parse_subscription(message.recipient)
            origin, target = split_url(endpoint)
            if origin.scheme != "https" and not ssrf.private_allowed():
                raise ValueError("not https")
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            return DeliveryResult(delivered=False, error_code="invalid_recipient", permanent=True,
                                  message="not a Web Push subscription with an https endpoint")  # fmt: skip
        content = push.PushContent.of(message.subject, message.body, message.push)
        plaintext = push.webpush_plaintext(content)
        if len(plaintext) + push.WEBPUSH_OVERHEAD > push.WEBPUSH_MAX_RECORD:
            return DeliveryResult(delivered=False, error_code="malformed_content", permanent=True,
                                  message="the message is over the Web Push record size")  # fmt: skip
        body = encrypt(plaintext, p256dh, auth)
        headers = [
            ("Authorization", self.vapid_header(origin)), ("TTL", str(content.ttl_seconds)),
            ("Urgency", content.urgency), ("Content-Encoding", "aes128gcm"),
            ("Content-Type", "application/octet-stream"),
        ]  # fmt: skip
        if content.collapse_key:
            headers.append(("Topic", topic_for(content.collapse_key)))
        return origin, build_head("POST", origin, target, headers, len(body)), body

    def _result(self, response: Response) -> DeliveryResult:
        status = response.status
        if 200 <= status < 300:
            return DeliveryResult(delivered=True, http_status=status)
        if 300 <= status < 400:
            return DeliveryResult(delivered=False, http_status=status, error_code="redirect", permanent=True,
                                  message=f"HTTP {status}: redirects are not followed")  # fmt: skip
        text = clean_message(f"HTTP {status} {response.reason}".strip(), self._secret_values())
        if status in (404, 410):
            return DeliveryResult(delivered=False, http_status=status, error_code=f"http_{status}", message=text,
                                  permanent=True, deactivate=f"http_{status}")  # fmt: skip
        return DeliveryResult(delivered=False, http_status=status, error_code=f"http_{status}", message=text,
                              retry_after=parse_retry_after(response.headers.get("retry-after")))  # fmt: skip

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
