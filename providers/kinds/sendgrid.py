"""SendGrid provider: email through the v3 Mail Send API (base URL configurable for tests).

`POST {base_url}/v3/mail/send` with `Authorization: Bearer <api_key>` and a JSON body of one
personalization; `custom_args: {"notification_id": …}` rides along so that every Event Webhook
event SendGrid posts back names the notification (receipts.vendors.sendgrid). SendGrid answers
`202 Accepted` with the message's id in `X-Message-Id`.

Config `{base_url, from_email, public_key}` / secrets `{api_key}`. `public_key` is the
Event Webhook verification key as SendGrid shows it (base64 of the DER SubjectPublicKeyInfo of a
P-256 key); it is optional for sending, and without it no event is accepted.

Classification as for the other HTTP kinds: 2xx delivered, 3xx permanent (never followed), 408,
425, 429 and 5xx transient (a 429's `X-RateLimit-Reset` is honoured like a Retry-After), other 4xx
permanent; a 400 naming the recipient is `invalid_recipient`, one naming the content
`malformed_content`.
"""

from __future__ import annotations

import base64
import binascii
import time
from functools import lru_cache

import orjson
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email

from core.http import HttpClient, Response, build_head, split_url
from providers.kinds.base import (
    BaseProvider,
    DeliveryResult,
    OutboundMessage,
    as_dict,
    check_destination_host,
    clean_message,
    config_error,
    parse_retry_after,
    provider_message_id,
    reject_unknown_keys,
)
from providers.transport import new_client

DEFAULT_BASE_URL = "https://api.sendgrid.com"
SEND_PATH = "/v3/mail/send"
TIMEOUT_SECONDS = 15.0
MAX_RATE_LIMIT_WAIT = 3600.0
MAX_PUBLIC_KEY_CHARS = 1024


@lru_cache(maxsize=256)
def load_public_key(text: str) -> ec.EllipticCurvePublicKey:
    """The Event Webhook verification key from SendGrid's base64 SPKI text; ValueError if it is not
    a P-256 public key. Cached: it is loaded again for every event request otherwise."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_PUBLIC_KEY_CHARS:
        raise ValueError("expected the base64 verification key SendGrid shows for the signed Event Webhook")
    cleaned = "".join(text.split())
    if cleaned.startswith("-----BEGIN"):  # a PEM pasted whole: keep the base64 between the markers
        cleaned = "".join(line for line in text.strip().splitlines() if not line.startswith("-----"))
    try:
        key = load_der_public_key(base64.b64decode(cleaned, validate=True))
    except (binascii.Error, ValueError, TypeError):
        raise ValueError("not a base64 DER public key (SubjectPublicKeyInfo) as SendGrid shows it") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("SendGrid signs with ECDSA on P-256: this is another kind of key")
    return key


class SendgridProvider(BaseProvider):
    kind = "sendgrid"
    options = ("http_client",)

    def __init__(self, config: dict, secrets: dict, *, http_client: HttpClient | None = None) -> None:
        super().__init__(config, secrets)
        base_url = (self.config.get("base_url") or DEFAULT_BASE_URL).rstrip("/")
        self._origin, target = split_url(base_url + SEND_PATH)
        self._head_prefix = build_head(
            "POST",
            self._origin,
            target,
            {
                "Authorization": f"Bearer {self.secrets.get('api_key', '')}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
            final=False,
        )
        self._from = {"email": self.config["from_email"]}
        self._owns_client = http_client is None
        self._client = http_client or new_client()

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        config, secrets = as_dict(config, "config"), as_dict(secrets, "secrets")
        reject_unknown_keys(config, ("base_url", "from_email", "public_key"), section="config")
        reject_unknown_keys(secrets, ("api_key",), section="secrets")
        from_email = config.get("from_email")
        try:
            validate_email(from_email)
        except DjangoValidationError:
            raise config_error("from_email", "required: a verified sender address such as alerts@example.com") from None
        base_url = config.get("base_url") or DEFAULT_BASE_URL
        if not isinstance(base_url, str):
            raise config_error("base_url", "must be an http(s) URL such as https://api.sendgrid.com")
        base_url = base_url.rstrip("/")
        try:
            origin, target = split_url(base_url)
        except ValueError as exc:
            raise config_error("base_url", str(exc)) from None
        if "?" in target:
            raise config_error("base_url", "must not have a query string")
        public_key = config.get("public_key") or ""
        if public_key:
            try:
                load_public_key(public_key)
            except ValueError as exc:
                raise config_error("public_key", str(exc)) from None
            public_key = "".join(public_key.split())
        api_key = secrets.get("api_key")
        if not isinstance(api_key, str) or not api_key.strip() or any(c.isspace() or ord(c) < 32 for c in api_key):
            raise config_error(
                "api_key", "required: a SendGrid API key (SG.…) with Mail Send access", section="secrets"
            )
        if check_destination:
            check_destination_host(origin.host, origin.port, "base_url")
        return {"base_url": base_url, "from_email": from_email, "public_key": public_key}

    def _body(self, message: OutboundMessage) -> bytes:
        payload = {
            "personalizations": [{"to": [{"email": message.recipient}]}],
            "from": self._from,
            "subject": message.subject,
            "content": [{"type": "text/plain", "value": message.body}],
            # Echoed in every Event Webhook event: how a receipt finds its notification.
            "custom_args": {"notification_id": message.notification_id},
        }
        if message.html_body:  # after text/plain: the order SendGrid requires
            payload["content"].append({"type": "text/html", "value": message.html_body})
        return orjson.dumps(payload)

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        try:
            body = self._body(message)
            head = self._head_prefix + b"Content-Length: %d\r\n\r\n" % len(body)
            response = await self._client.send(self._origin, head, body, TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            return self._failure(exc)
        return self._result(response)

    def _result(self, response: Response) -> DeliveryResult:
        status = response.status
        if 200 <= status < 300:
            message_id = response.headers.get("x-message-id", "")
            return DeliveryResult(
                delivered=True,
                http_status=status,
                message=clean_message(f"message id {message_id}"),
                provider_message_id=provider_message_id(message_id),
            )
        if 300 <= status < 400:
            return DeliveryResult(
                delivered=False, http_status=status, error_code="redirect", message="redirect refused", permanent=True
            )
        errors = _errors(response.body)
        described = "; ".join(_describe(e) for e in errors) or response.body[:200].decode("utf-8", "replace")
        text = clean_message(f"HTTP {status}: {described}", self._secret_values())
        fields = {str(e.get("field") or "") for e in errors}
        if status == 400 and any(f.startswith("personalizations") and ".to" in f for f in fields):
            return DeliveryResult(
                delivered=False, http_status=status, error_code="invalid_recipient", message=text, permanent=True
            )
        if status == 413 or (status == 400 and any(f.startswith(("content", "subject")) for f in fields)):
            return DeliveryResult(
                delivered=False, http_status=status, error_code="malformed_content", message=text, permanent=True
            )
        return DeliveryResult(
            delivered=False,
            http_status=status,
            retry_after=_retry_after(response) if status == 429 or status >= 500 else None,
            error_code=f"http_{status}",
            message=text,
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _errors(body: bytes) -> list[dict]:
    """SendGrid's `{"errors": [{"message", "field", "help"}]}`, or nothing."""
    try:
        data = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        return []
    errors = data.get("errors") if isinstance(data, dict) else None
    return [e for e in errors if isinstance(e, dict)][:10] if isinstance(errors, list) else []


def _describe(error: dict) -> str:
    field = error.get("field")
    return f"{field}: {error.get('message', '')}" if field else str(error.get("message", ""))


def _retry_after(response: Response) -> float | None:
    """Retry-After where given, else SendGrid's `X-RateLimit-Reset` (epoch seconds of the next window)."""
    after = parse_retry_after(response.headers.get("retry-after"))
    if after is not None:
        return after
    reset = response.headers.get("x-ratelimit-reset", "").strip()
    if reset.isdigit():
        return min(MAX_RATE_LIMIT_WAIT, max(0.0, int(reset) - time.time()))
    return None
