"""Twilio provider: SMS through the Messages REST API (base URL configurable for tests).

Every send sets `StatusCallback` to the provider's events URL with the notification
id in its query (`?n=<id>`): Twilio signs the whole URL, so the id it echoes back is covered by the
`X-Twilio-Signature` that receipts.vendors.twilio checks. No StatusCallback when
OMNIPOST_PUBLIC_URL is empty or the instance was built without its `provider_id`.
"""

from __future__ import annotations

import base64
import json
import re
from urllib.parse import quote, urlencode

from core.http import HttpClient, build_head, split_url
from providers.kinds.base import (
    BaseProvider,
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

DEFAULT_BASE_URL = "https://api.twilio.com"
TIMEOUT_SECONDS = 15.0
ACCOUNT_SID_RE = re.compile(r"AC[0-9a-fA-F]{32}")
E164_RE = re.compile(r"\+[1-9]\d{1,14}")
# Twilio error codes that mean "this recipient cannot be reached": retrying will not help.
# https://www.twilio.com/docs/api/errors
RECIPIENT_ERRORS = frozenset({21211, 21214, 21217, 21219, 21401, 21407, 21408, 21421, 21610, 21612, 21614, 21635})
CONTENT_ERRORS = frozenset({21602, 21617, 21619})  # body missing / too long / no content


class TwilioProvider(BaseProvider):
    kind = "twilio"
    options = ("http_client", "provider_id")
    # A changed auth token keeps the old one for the rotation grace: Twilio signs status callbacks
    # with its primary token, which may still be the old one until the secondary is promoted there.
    rotating_secrets = ("auth_token",)

    def __init__(
        self, config: dict, secrets: dict, *, http_client: HttpClient | None = None, provider_id: int | None = None
    ) -> None:
        super().__init__(config, secrets)
        from providers.models import receipts_url  # the one place that builds it; models load after apps

        callback = receipts_url(provider_id)
        self._status_callback = f"{callback}?n=" if callback else ""
        sid = self.config["account_sid"]
        base_url = (self.config.get("base_url") or DEFAULT_BASE_URL).rstrip("/")
        self._origin, target = split_url(f"{base_url}/2010-04-01/Accounts/{quote(sid)}/Messages.json")
        token = base64.b64encode(f"{sid}:{self.secrets.get('auth_token', '')}".encode()).decode("ascii")
        self._head_prefix = build_head(
            "POST",
            self._origin,
            target,
            {
                "Authorization": f"Basic {token}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
            final=False,
        )
        self._secret_texts = [self.secrets.get("auth_token", ""), token]
        self._owns_client = http_client is None
        self._client = http_client or new_client()

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        config, secrets = as_dict(config, "config"), as_dict(secrets, "secrets")
        reject_unknown_keys(config, ("account_sid", "from_number", "base_url"), section="config")
        reject_unknown_keys(secrets, ("auth_token",), section="secrets")
        sid = config.get("account_sid")
        if not isinstance(sid, str) or not ACCOUNT_SID_RE.fullmatch(sid):
            raise config_error("account_sid", "required: 'AC' followed by 32 hexadecimal characters")
        from_number = config.get("from_number")
        if not isinstance(from_number, str) or not E164_RE.fullmatch(from_number):
            raise config_error("from_number", "required: a phone number in E.164 form, e.g. +15005550006")
        base_url = config.get("base_url") or DEFAULT_BASE_URL
        if not isinstance(base_url, str):
            raise config_error("base_url", "must be an http(s) URL such as https://api.twilio.com")
        base_url = base_url.rstrip("/")
        try:
            origin, target = split_url(base_url)
        except ValueError as exc:
            raise config_error("base_url", str(exc)) from None
        if "?" in target:
            raise config_error("base_url", "must not have a query string")
        token = secrets.get("auth_token")
        if not isinstance(token, str) or not token.strip():
            raise config_error("auth_token", "required: the account's auth token", section="secrets")
        if check_destination:
            check_destination_host(origin.host, origin.port, "base_url")
        return {"account_sid": sid, "from_number": from_number, "base_url": base_url}

    def _secret_values(self) -> list[str]:
        return [s for s in self._secret_texts if s]

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        if not E164_RE.fullmatch(message.recipient):
            return DeliveryResult(
                delivered=False,
                error_code="invalid_recipient",
                message="recipient is not an E.164 phone number",
                permanent=True,
            )
        try:
            fields = {"To": message.recipient, "From": self.config["from_number"], "Body": message.body}
            if self._status_callback:
                fields["StatusCallback"] = self._status_callback + quote(message.notification_id, safe="")
            form = urlencode(fields).encode()
            head = self._head_prefix + b"Content-Length: %d\r\n\r\n" % len(form)
            response = await self._client.send(self._origin, head, form, TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            return self._failure(exc)
        status = response.status
        try:
            data = json.loads(response.body) if response.body else {}
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        if 200 <= status < 300:
            return DeliveryResult(
                delivered=True, http_status=status, message=clean_message(f"sid {data.get('sid', '')}")
            )
        if 300 <= status < 400:
            return DeliveryResult(
                delivered=False, http_status=status, error_code="redirect", message="redirect refused", permanent=True
            )
        code = data.get("code")
        text = clean_message(f"HTTP {status}: Twilio error {code}: {data.get('message', '')}", self._secret_values())
        if code in RECIPIENT_ERRORS:
            return DeliveryResult(
                delivered=False, http_status=status, error_code="invalid_recipient", message=text, permanent=True
            )
        if code in CONTENT_ERRORS:
            return DeliveryResult(
                delivered=False, http_status=status, error_code="malformed_content", message=text, permanent=True
            )
        return DeliveryResult(
            delivered=False,
            http_status=status,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            error_code=f"twilio_{code}" if isinstance(code, int) else f"http_{status}",
            message=text,
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
