"""Amazon SES provider: email through the SES v2 `SendEmail` API, signed with botocore's SigV4 signer.

`POST {base_url}/v2/email/outbound-emails` (base URL `https://email.{region}.amazonaws.com` unless
configured, for tests or a VPC endpoint) with a JSON `Content.Simple` message. The request is signed
by `botocore.auth.SigV4Auth` (service `ses`, the configured region) and sent through OmniPost's own
HTTP client with the SSRF guard, so the signer is AWS's and the transport is the one every HTTP
provider shares.

Every message carries the notification id twice: as the `notification_id` email tag (SES event
publishing echoes tags in `mail.tags`, which is how `receipts.vendors.ses` finds the notification a
Bounce/Complaint/Delivery event is about) and as the `X-OmniPost-Notification-Id` header. SES's
`MessageId` for the send is the result's `provider_message_id` (stored per provider by the dispatcher):
an event without those tags or headers names the message by it (`mail.messageId`).

Errors: 2xx delivered; 3xx permanent (never followed); 408/425/429/5xx transient, and SES's own
throttling types (`TooManyRequestsException`, `LimitExceededException`, `Throttling`) whatever their
status; other 4xx (`MessageRejected`, `MailFromDomainNotVerifiedException`, `BadRequestException`,
`AccountSuspendedException`, 403 signature errors, ...) permanent. The error code is
`ses_<ErrorType>` (from `x-amzn-ErrorType`, else the body's `__type`/`code`), else `http_<status>`.
"""

from __future__ import annotations

import json
import re

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

SERVICE = "ses"  # SES v2's SigV4 signing name
SEND_PATH = "/v2/email/outbound-emails"
TIMEOUT_SECONDS = 15.0
TAG_NAME = "notification_id"
HEADER_NAME = "X-OmniPost-Notification-Id"
REGION_RE = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d{1,2}")
ACCESS_KEY_ID_RE = re.compile(r"[A-Z0-9]{16,128}")
CONFIGURATION_SET_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOPIC_ARN_RE = re.compile(r"arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}(?:\.fifo)?")
# SES error types that mean "slow down", sent with 429 or (older APIs, quotas) 400.
THROTTLING_ERRORS = frozenset(
    {"TooManyRequestsException", "LimitExceededException", "Throttling", "ThrottlingException"}
)
_ERROR_TYPE_RE = re.compile(r"[A-Za-z0-9_.]{1,100}")


def default_base_url(region: str) -> str:
    return f"https://email.{region}.amazonaws.com"


def error_type(response: Response, data: dict) -> str:
    """SES's error type: `x-amzn-ErrorType` (`Name:uri`), else the JSON body's `__type` / `code`."""
    raw = response.headers.get("x-amzn-errortype") or data.get("__type") or data.get("code") or ""
    if not isinstance(raw, str):
        return ""
    name = raw.split(":", 1)[0].rsplit("#", 1)[-1].strip()
    return name if _ERROR_TYPE_RE.fullmatch(name) else ""


class SesProvider(BaseProvider):
    kind = "ses"
    options = ("http_client",)

    def __init__(self, config: dict, secrets: dict, *, http_client: HttpClient | None = None) -> None:
        super().__init__(config, secrets)
        self.region = self.config["region"]
        self.from_email = self.config["from_email"]
        self.configuration_set = self.config.get("configuration_set") or ""
        base_url = (self.config.get("base_url") or default_base_url(self.region)).rstrip("/")
        self.url = base_url + SEND_PATH
        self._origin, self._target = split_url(self.url)
        # botocore costs ≈ 0.25 s of imports: loaded by the processes that build an SES provider only.
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        self._request_class = AWSRequest
        self._signer = SigV4Auth(
            Credentials(self.config["access_key_id"], self.secrets.get("secret_access_key", "")), SERVICE, self.region
        )
        self._owns_client = http_client is None
        self._client = http_client or new_client()

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        config, secrets = as_dict(config, "config"), as_dict(secrets, "secrets")
        reject_unknown_keys(
            config,
            ("region", "base_url", "from_email", "access_key_id", "configuration_set", "topic_arn"),
            section="config",
        )
        reject_unknown_keys(secrets, ("secret_access_key",), section="secrets")
        region = config.get("region")
        if not isinstance(region, str) or not REGION_RE.fullmatch(region):
            raise config_error("region", "required: an AWS region such as eu-west-1")
        from_email = config.get("from_email")
        try:
            if not isinstance(from_email, str):
                raise DjangoValidationError("not a string")
            validate_email(from_email)
        except DjangoValidationError:
            raise config_error(
                "from_email", "required: a verified SES sender address such as alerts@example.com"
            ) from None
        key_id = config.get("access_key_id")
        if not isinstance(key_id, str) or not ACCESS_KEY_ID_RE.fullmatch(key_id):
            raise config_error("access_key_id", "required: the IAM access key id (e.g. AKIAIOSFODNN7EXAMPLE)")
        secret = secrets.get("secret_access_key")
        if not isinstance(secret, str) or len(secret.strip()) < 16:
            raise config_error("secret_access_key", "required: the IAM secret access key", section="secrets")
        base_url = config.get("base_url") or default_base_url(region)
        if not isinstance(base_url, str):
            raise config_error("base_url", "must be an http(s) URL such as https://email.eu-west-1.amazonaws.com")
        base_url = base_url.rstrip("/")
        try:
            origin, target = split_url(base_url)
        except ValueError as exc:
            raise config_error("base_url", str(exc)) from None
        if "?" in target or "#" in base_url:
            raise config_error("base_url", "must not have a query string or fragment")
        out = {"region": region, "base_url": base_url, "from_email": from_email, "access_key_id": key_id}
        configuration_set = config.get("configuration_set")
        if configuration_set not in (None, ""):
            if not isinstance(configuration_set, str) or not CONFIGURATION_SET_RE.fullmatch(configuration_set):
                raise config_error("configuration_set", "a configuration set name: letters, digits, _ and -, ≤ 64")
            out["configuration_set"] = configuration_set
        topic_arn = config.get("topic_arn")
        if topic_arn not in (None, ""):
            if not isinstance(topic_arn, str) or not TOPIC_ARN_RE.fullmatch(topic_arn):
                raise config_error(
                    "topic_arn", "an SNS topic ARN such as arn:aws:sns:eu-west-1:123456789012:ses-events"
                )
            out["topic_arn"] = topic_arn
        if check_destination:
            check_destination_host(origin.host, origin.port, "base_url")
        return out

    def _secret_values(self) -> list[str]:
        return [s for s in (self.secrets.get("secret_access_key", ""),) if s]

    def payload(self, message: OutboundMessage) -> dict:
        """The SendEmail request body (SES v2 JSON)."""
        body: dict = {
            "FromEmailAddress": self.from_email,
            "Destination": {"ToAddresses": [message.recipient]},
            "Content": {
                "Simple": {
                    "Subject": {"Data": message.subject, "Charset": "UTF-8"},
                    "Body": {"Text": {"Data": message.body, "Charset": "UTF-8"}},
                    "Headers": [{"Name": HEADER_NAME, "Value": message.notification_id}],
                }
            },
            "EmailTags": [{"Name": TAG_NAME, "Value": message.notification_id}],
        }
        if message.html_body:  # both parts: SES sends multipart/alternative
            body["Content"]["Simple"]["Body"]["Html"] = {"Data": message.html_body, "Charset": "UTF-8"}
        if self.configuration_set:
            body["ConfigurationSetName"] = self.configuration_set
        return body

    def signed_head(self, body: bytes) -> bytes:
        """The request head with SigV4 headers botocore computed for this body (now)."""
        request = self._request_class(
            method="POST", url=self.url, data=body, headers={"Content-Type": "application/json"}
        )
        self._signer.add_auth(request)
        headers = [(name, value) for name, value in request.headers.items() if name.lower() != "host"]
        headers.append(("Accept", "application/json"))
        return build_head("POST", self._origin, self._target, headers, len(body))

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        try:
            validate_email(message.recipient)
        except DjangoValidationError:
            return DeliveryResult(
                delivered=False,
                error_code="invalid_recipient",
                message="recipient is not a valid email address",
                permanent=True,
            )
        try:
            body = json.dumps(self.payload(message), ensure_ascii=False, separators=(",", ":")).encode()
            head = self.signed_head(body)
            response = await self._client.send(self._origin, head, body, TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            return self._failure(exc)
        return self._result(response)

    def _result(self, response: Response) -> DeliveryResult:
        status = response.status
        try:
            data = json.loads(response.body) if response.body else {}
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        if 200 <= status < 300:
            message_id = provider_message_id(data.get("MessageId"))
            text = clean_message(f"SES message id {message_id}") if message_id else ""
            return DeliveryResult(delivered=True, http_status=status, message=text, provider_message_id=message_id)
        if 300 <= status < 400:
            return DeliveryResult(
                delivered=False, http_status=status, error_code="redirect", message="redirect refused", permanent=True
            )
        kind = error_type(response, data)
        detail = data.get("message") or data.get("Message") or ""
        text = clean_message(
            f"HTTP {status}: SES {kind or 'error'}: {detail if isinstance(detail, str) else ''}".strip(),
            self._secret_values(),
        )
        throttled = kind in THROTTLING_ERRORS
        return DeliveryResult(
            delivered=False,
            http_status=status,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            error_code=f"ses_{kind}" if kind else f"http_{status}",
            message=text,
            permanent=False if throttled else None,  # otherwise the classifier's status rules decide
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
