"""What every provider shares: the message and result types, the error type, and the base class.

A provider's `send()` never raises for a delivery problem: it returns a `DeliveryResult` whose
`error_code` is a stable machine code; `dlq.classifier.classify()` turns that into an outcome.
"""

from __future__ import annotations

import re
import socket
import ssl
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, Protocol

from rest_framework.exceptions import ValidationError

from core.http import HttpError
from core.masking import mask_text
from providers import ssrf
from providers.ssrf import DestinationForbidden

MAX_MESSAGE_CHARS = 500
MAX_PROVIDER_MESSAGE_ID = 200
_PROVIDER_MESSAGE_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_PROVIDER_MESSAGE_ID}}}")


def provider_message_id(value: object) -> str:
    """A provider's message id as stored: printable ASCII without spaces, ≤ MAX_PROVIDER_MESSAGE_ID
    characters; anything else (absent, a number, an odd string) is no id ("")."""
    return value if isinstance(value, str) and _PROVIDER_MESSAGE_ID.fullmatch(value) else ""


@dataclass(slots=True)  # not frozen: a frozen init costs ≈ 2 µs a message; providers only read it
class OutboundMessage:
    notification_id: str  # UUID string: the idempotency key (= Standard Webhooks `webhook-id`)
    tenant_id: str
    channel: str
    recipient: str  # plaintext: never log it unmasked
    subject: str
    body: str
    metadata: dict = field(default_factory=dict)
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    attempt: int = 1
    # Extra message headers (email: List-Unsubscribe, List-Unsubscribe-Post; recipients.unsubscribe).
    headers: tuple[tuple[str, str], ...] = ()
    # W3C trace context of the send (core.tracing), where traces are exported: a provider whose
    # request can carry it (the webhook's) sends it as the `traceparent` header. Empty: none.
    traceparent: str = ""
    # A push notification's push fields (providers.kinds.push.PUSH_FIELDS): the native push kinds read them.
    push: dict | None = None
    # Email: the HTML part, sent beside `body` (multipart/alternative; SES Body.Html; SendGrid text/html).
    html_body: str = ""


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    delivered: bool
    http_status: int | None = None
    retry_after: float | None = None  # seconds from now
    error_code: str = ""  # http_503, timeout, connect_error, dns_error, destination_forbidden, redirect, ...
    error_class: str = ""  # exception class name when an exception happened
    message: str = ""  # human text with recipients and secrets stripped
    permanent: bool | None = None  # provider hint; None lets the classifier decide
    # The id the provider gave the accepted message (SES's MessageId, SendGrid's X-Message-Id): stored
    # per provider (notifications.models.ProviderMessage) for receipts that name only it. Opaque, never
    # an address or a secret; empty when the provider gives none (at most MAX_PROVIDER_MESSAGE_ID chars).
    provider_message_id: str = ""
    # A push vendor said the device token is dead (APNs 410 Unregistered, FCM UNREGISTERED, Web Push
    # 404/410, …): the device is deactivated with this reason and never sent to again. Empty: not that.
    deactivate: str = ""


class DeliveryError(Exception):
    """A delivery problem with a stable code; `send()` turns it into a DeliveryResult."""

    code: str = "delivery_error"
    permanent: bool | None = None

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        permanent: bool | None = None,
        retry_after: float | None = None,
        http_status: int | None = None,
    ) -> None:
        super().__init__(message or self.code)
        if code is not None:
            self.code = code
        if permanent is not None:
            self.permanent = permanent
        self.retry_after = retry_after
        self.http_status = http_status


_DELAY_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from `now` until the time a Retry-After header names (delay-seconds or HTTP-date).

    Returns None when absent or unparsable, 0.0 for a date in the past. Callers bound the result.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # RFC 9110 dates are always GMT
        when = when.replace(tzinfo=UTC)
    now = now or datetime.now(UTC)
    return max(0.0, (when - now).total_seconds())


def clean_message(text: str, secrets: Iterable[str] = ()) -> str:
    """Human-readable text with secrets removed, recipients masked and length bounded."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "****")
    text = mask_text(text)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def result_from_exception(exc: BaseException, secrets: Iterable[str] = ()) -> DeliveryResult:
    """Map an exception raised while delivering to a DeliveryResult with a stable error code."""
    name = type(exc).__name__
    text = clean_message(f"{name}: {exc}", secrets)
    if isinstance(exc, DeliveryError | HttpError):  # the same attributes
        return DeliveryResult(
            delivered=False,
            http_status=exc.http_status,
            retry_after=exc.retry_after,
            error_code=exc.code,
            error_class=name,
            message=text,
            permanent=exc.permanent,
        )
    if isinstance(exc, DestinationForbidden):
        code, permanent = exc.code, True
    elif isinstance(exc, TimeoutError | socket.timeout):
        code, permanent = "timeout", None
    elif isinstance(exc, socket.gaierror):
        code, permanent = "dns_error", None
    elif isinstance(exc, ssl.SSLError | ssl.CertificateError):
        code, permanent = "tls_error", None
    elif isinstance(exc, OSError):  # refused, reset, unreachable, ...
        code, permanent = "connect_error", None
    else:  # unknown: the classifier treats it as transient and logs it loudly
        code, permanent = "unexpected_error", None
    return DeliveryResult(delivered=False, error_code=code, error_class=name, message=text, permanent=permanent)


def config_error(field_name: str, message: str, *, section: str = "config") -> ValidationError:
    return ValidationError({section: {field_name: [message]}})


def reject_unknown_keys(data: dict, allowed: Iterable[str], *, section: str) -> None:
    allowed = tuple(allowed)
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        hint = ", ".join(allowed) if allowed else "none"
        raise ValidationError(
            {section: {key: [f"unknown {section} key for this provider kind; allowed: {hint}"] for key in unknown}}
        )


class Cancellable(Protocol):
    def cancel(self) -> object: ...


class BaseProvider(ABC):
    """One delivery transport. Instances are reusable across messages and must be closed."""

    kind: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()  # keyword-only constructor options build_provider() passes on
    # Secrets whose old value keeps working for a grace period after a change (a webhook's signing
    # secret); their replaced values are kept, encrypted, as the provider's `previous_secrets`.
    rotating_secrets: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: dict, secrets: dict) -> None:
        self.config = dict(config or {})
        self.secrets = dict(secrets or {})

    @classmethod
    @abstractmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        """Return the normalised config or raise ValidationError({"config"|"secrets": {field: [msg]}})."""

    @abstractmethod
    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """Deliver one message; never raises for delivery problems."""

    def start_send(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> Cancellable | None:
        """`send` without a coroutine, a task or a future, where a provider can (the dispatcher's hot
        path, ≈ 4 µs a delivery less): the send starts now, and `on_result(result)` follows once, on the
        event loop, never from within this call, unless the returned handle is cancelled first.
        None: not supported here, await `send()` instead."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most providers hold nothing
        """Release connections and other resources."""

    def _answered(self, on_result: Callable[[DeliveryResult], object]) -> Callable[[Any, BaseException | None], None]:
        """The `on_done(response, error)` of a request that `start_send` started: the response judged
        by the provider's `_result` (an error, or a crash judging it, by `_failure`), then `on_result`."""

        def done(response: Any, error: BaseException | None) -> None:  # noqa: ANN401 - a core.http Response
            try:
                result = self._result(response) if error is None else self._failure(error)  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
                result = self._failure(exc)
            on_result(result)

        return done

    def _secret_values(self) -> list[str]:
        return [str(v) for v in self.secrets.values() if v]

    def _failure(self, exc: BaseException) -> DeliveryResult:
        return result_from_exception(exc, self._secret_values())

    def __repr__(self) -> str:  # never show secrets
        return f"<{type(self).__name__} kind={self.kind}>"


def as_dict(value: Any, section: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError({section: [f"{section} must be a JSON object"]})
    return value


def check_destination_host(host: str, port: int, field_name: str, section: str = "config") -> None:
    """Save-time SSRF check: resolve `host` and refuse non-public addresses.

    Skipped entirely when OMNIPOST_ALLOW_PRIVATE_DESTINATIONS is on (nothing to refuse then, and
    test or air-gapped setups may use names that do not resolve yet). Send time checks again.
    """
    if ssrf.private_allowed():
        return
    try:
        ssrf.resolve_checked(host, port, allow_private=False)
    except DestinationForbidden as exc:
        raise config_error(field_name, str(exc), section=section) from None
    except (OSError, UnicodeError):
        raise config_error(field_name, f"the host {host} does not resolve", section=section) from None
