"""SMTP provider: stdlib smtplib in a worker thread, with STARTTLS / implicit TLS and AUTH.

The host is resolved and every address checked by the SSRF guard before connecting; the socket
then connects to the checked address while TLS verifies the configured host name (SNI).
A 5xx reply is a permanent failure, a 4xx reply or a connection problem a transient one.
"""

from __future__ import annotations

import asyncio
import smtplib
import socket
import ssl
from email.message import EmailMessage
from email.utils import formatdate

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email

from notifications import ssrf
from notifications.providers.base import (
    BaseProvider,
    DeliveryResult,
    OutboundMessage,
    as_dict,
    check_destination_host,
    clean_message,
    config_error,
    reject_unknown_keys,
)

TIMEOUT_SECONDS = 30.0


def tls_context() -> ssl.SSLContext:
    """The context used for STARTTLS and implicit TLS (tests may substitute one trusting their CA)."""
    return ssl.create_default_context()


class _PinnedSMTP(smtplib.SMTP):
    """smtplib.SMTP that connects to a pre-checked IP while keeping the host name for TLS."""

    _address: tuple

    def __init__(self, *args: object, address: tuple | None = None, **kwargs: object) -> None:
        if address is not None:
            self._address = address
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return socket.create_connection(self._address[:2], timeout, self.source_address)


class _PinnedSMTPSSL(smtplib.SMTP_SSL, _PinnedSMTP):
    """Implicit TLS. MRO SMTP_SSL -> _PinnedSMTP -> SMTP: SMTP_SSL wraps the pinned socket."""

    def __init__(self, *args: object, address: tuple, **kwargs: object) -> None:
        self._address = address
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


class SmtpProvider(BaseProvider):
    kind = "smtp"
    options = ("ssl_context",)

    def __init__(self, config: dict, secrets: dict, *, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(config, secrets)
        self.host = self.config["host"]
        self.use_ssl = bool(self.config.get("use_ssl"))
        self.use_tls = bool(self.config.get("use_tls"))
        self.port = int(self.config.get("port") or default_port(self.use_tls, self.use_ssl))
        self.from_email = self.config["from_email"]
        self.username = self.config.get("username") or ""
        self._ssl_context = ssl_context

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        config, secrets = as_dict(config, "config"), as_dict(secrets, "secrets")
        reject_unknown_keys(config, ("host", "port", "use_tls", "use_ssl", "from_email", "username"), section="config")
        reject_unknown_keys(secrets, ("password",), section="secrets")
        host = config.get("host")
        if not isinstance(host, str) or not host.strip() or any(c in host for c in " /\\@\r\n"):
            raise config_error("host", "required: the SMTP server's host name or IP address")
        host = host.strip().strip("[]")
        for flag in ("use_tls", "use_ssl"):
            if not isinstance(config.get(flag, False), bool):
                raise config_error(flag, "must be true or false")
        use_tls, use_ssl = config.get("use_tls", False), config.get("use_ssl", False)
        if use_tls and use_ssl:
            raise config_error(
                "use_ssl", "use_tls (STARTTLS, usually port 587) and use_ssl (port 465) exclude each other"
            )
        port = config.get("port", default_port(use_tls, use_ssl))
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise config_error("port", "must be an integer between 1 and 65535")
        from_email = config.get("from_email")
        try:
            validate_email(from_email)
        except DjangoValidationError:
            raise config_error("from_email", "required: a valid sender address such as alerts@example.com") from None
        username = config.get("username") or ""
        if not isinstance(username, str):
            raise config_error("username", "must be a string")
        password = secrets.get("password") or ""
        if not isinstance(password, str):
            raise config_error("password", "must be a string", section="secrets")
        if username and not password:
            raise config_error("password", "required when a username is set", section="secrets")
        if check_destination:
            check_destination_host(host, port, "host")
        return {
            "host": host,
            "port": port,
            "use_tls": use_tls,
            "use_ssl": use_ssl,
            "from_email": from_email,
            "username": username,
        }

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        return await asyncio.to_thread(self._send_blocking, message)

    def _build(self, message: OutboundMessage) -> EmailMessage:
        email = EmailMessage()
        email["From"] = self.from_email
        email["To"] = message.recipient
        email["Subject"] = message.subject
        email["Date"] = formatdate(message.created_at.timestamp(), usegmt=True)
        domain = self.from_email.rpartition("@")[2] or "omnipost"
        email["Message-ID"] = f"<{message.notification_id}@{domain}>"
        email["X-OmniPost-Notification-Id"] = message.notification_id
        email.set_content(message.body)
        return email

    def _send_blocking(self, message: OutboundMessage) -> DeliveryResult:
        try:
            validate_email(message.recipient)
        except DjangoValidationError:
            return DeliveryResult(
                delivered=False, error_code="invalid_recipient", message="not an email address", permanent=True
            )
        try:
            email = self._build(message)
        except (ValueError, TypeError) as exc:
            return DeliveryResult(
                delivered=False,
                error_code="malformed_content",
                error_class=type(exc).__name__,
                message=clean_message(str(exc)),
                permanent=True,
            )
        try:
            infos = ssrf.resolve_checked(self.host, self.port)
            return self._deliver(self._connect(infos), email, message.recipient)
        except smtplib.SMTPRecipientsRefused as exc:
            code, reply = next(iter(exc.recipients.values()), (550, b"recipient refused"))
            return self._smtp_failure(exc, code, reply)
        except smtplib.SMTPResponseException as exc:  # sender refused, data refused, auth failed, greeting
            return self._smtp_failure(exc, exc.smtp_code, exc.smtp_error)
        except smtplib.SMTPNotSupportedError as exc:
            return DeliveryResult(
                delivered=False,
                error_code="smtp_unsupported",
                error_class=type(exc).__name__,
                message=clean_message(f"the server does not support a required extension: {exc}"),
                permanent=True,
            )
        except smtplib.SMTPServerDisconnected as exc:
            return DeliveryResult(
                delivered=False,
                error_code="connect_error",
                error_class=type(exc).__name__,
                message=clean_message(f"server disconnected: {exc}", self._secret_values()),
            )
        except Exception as exc:  # noqa: BLE001 - timeouts, refused connections, TLS and DNS errors
            return self._failure(exc)

    def _connect(self, infos: list[tuple]) -> smtplib.SMTP:
        """Open a session to the first checked address that accepts a connection."""
        context = self._ssl_context or tls_context()
        refused: OSError | None = None
        for info in infos:
            try:
                if self.use_ssl:
                    return _PinnedSMTPSSL(
                        address=info[4], host=self.host, port=self.port, timeout=TIMEOUT_SECONDS, context=context
                    )
                return _PinnedSMTP(address=info[4], host=self.host, port=self.port, timeout=TIMEOUT_SECONDS)
            except OSError as exc:
                if isinstance(exc, smtplib.SMTPException | ssl.SSLError | TimeoutError):
                    raise  # the server answered (or hung): trying another address would not help
                refused = exc
        raise refused or ConnectionRefusedError(f"no address of {self.host} accepted a connection")

    def _deliver(self, client: smtplib.SMTP, email: EmailMessage, recipient: str) -> DeliveryResult:
        context = self._ssl_context or tls_context()
        try:
            if self.use_tls:
                client.starttls(context=context)
            if self.username:
                client.login(self.username, self.secrets.get("password", ""))
            client.send_message(email, from_addr=self.from_email, to_addrs=[recipient])
        finally:
            try:
                client.quit()
            except (smtplib.SMTPException, OSError):
                client.close()
        return DeliveryResult(delivered=True, message="250 accepted")

    def _smtp_failure(self, exc: Exception, code: int, reply: bytes | str) -> DeliveryResult:
        text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
        return DeliveryResult(
            delivered=False,
            error_code=f"smtp_{code}",
            error_class=type(exc).__name__,
            message=clean_message(f"{code} {text}", self._secret_values()),
            permanent=500 <= code < 600 if isinstance(code, int) and code >= 400 else None,
        )


def default_port(use_tls: bool, use_ssl: bool) -> int:
    return 465 if use_ssl else 587 if use_tls else 25
