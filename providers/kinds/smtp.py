"""SMTP provider: stdlib smtplib in a worker thread, with STARTTLS / implicit TLS and AUTH.

The host is resolved and every address checked by the SSRF guard before connecting; the socket
then connects to the checked address while TLS verifies the configured host name (SNI).
A 5xx reply is a permanent failure, a 4xx reply or a connection problem a transient one.

Deadlines: one per send (`timeout_seconds`, default 30) for the whole dialogue, connect to QUIT.
The event loop keeps it: at the deadline, or when the send is cancelled (the dispatcher's shutdown
grace is over), it shuts the session's socket down from outside, so the thread blocked in smtplib
errors out at once and nothing more can be written: a send given back cannot deliver later.
Threads: SMTP sends run on their own pool (OMNIPOST_SMTP_THREADS), not asyncio's default executor,
and one provider holds at most OMNIPOST_SMTP_THREADS_PER_PROVIDER of them (its further sends wait,
within their deadline), so one tenant's slow server cannot take every thread.
Envelope sender: with OMNIPOST_BOUNCE_DOMAIN set and the provider's id known (the dispatcher
passes `provider_id`), MAIL FROM is the send's VERP return path (providers.verp), so its
bounces reach `run_bounce_listener`; the From header is always `from_email`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import smtplib
import socket
import ssl
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from email.message import EmailMessage
from email.policy import default as _default_policy
from email.utils import formatdate

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email

from providers import ssrf, verp
from providers.kinds.base import (
    BaseProvider,
    DeliveryResult,
    OutboundMessage,
    as_dict,
    check_destination_host,
    clean_message,
    config_error,
    reject_unknown_keys,
)

DEFAULT_TIMEOUT_SECONDS = 30.0
MAX_TIMEOUT_SECONDS = 120.0
_LONG_LINES = _default_policy.clone(max_line_length=998)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def thread_pool() -> ThreadPoolExecutor:
    """The threads every SMTP send runs on (OMNIPOST_SMTP_THREADS), created on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=int(getattr(settings, "OMNIPOST_SMTP_THREADS", 32)), thread_name_prefix="omnipost-smtp"
            )
        return _pool


class _Aborted(OSError):
    """The send was aborted (deadline or cancel) before or while its socket was opened."""


class _Session:
    """One send's TCP connection as seen from outside its thread. `abort()` (event loop) shuts the
    connection down through a duplicate of the socket: that works whatever smtplib has wrapped
    around it since (STARTTLS, implicit TLS), wakes a thread blocked in recv() or send(), and makes
    every later write fail."""

    __slots__ = ("_lock", "_dup", "aborted")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dup: socket.socket | None = None
        self.aborted = False

    def attach(self, sock: socket.socket) -> None:
        """In the send's thread, right after connecting and before a byte is exchanged."""
        dup = sock.dup()
        with self._lock:
            if not self.aborted:
                self._dup = dup
                return
        dup.close()
        sock.close()
        raise _Aborted("the send was aborted before its connection was used")

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            if self._dup is not None:
                with contextlib.suppress(OSError):
                    self._dup.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        """In the send's thread, when it is done with the connection."""
        with self._lock:
            dup, self._dup = self._dup, None
        if dup is not None:
            dup.close()


def tls_context() -> ssl.SSLContext:
    """The context used for STARTTLS and implicit TLS (tests may substitute one trusting their CA)."""
    return ssl.create_default_context()


class _PinnedSMTP(smtplib.SMTP):
    """smtplib.SMTP that connects to a pre-checked IP while keeping the host name for TLS."""

    _address: tuple
    _session: _Session

    def __init__(self, *args: object, address: tuple | None = None, session: _Session, **kwargs: object) -> None:
        if address is not None:
            self._address = address
        self._session = session
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        sock = socket.create_connection(self._address[:2], timeout, self.source_address)
        self._session.attach(sock)
        return sock


class _PinnedSMTPSSL(smtplib.SMTP_SSL, _PinnedSMTP):
    """Implicit TLS. MRO SMTP_SSL -> _PinnedSMTP -> SMTP: SMTP_SSL wraps the pinned socket."""

    def __init__(self, *args: object, address: tuple, session: _Session, **kwargs: object) -> None:
        self._address = address
        self._session = session
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def _timed_out(seconds: float) -> DeliveryResult:
    return DeliveryResult(
        delivered=False,
        error_code="timeout",
        error_class="TimeoutError",
        message=f"the SMTP dialogue did not finish within its {seconds:g}s deadline (timeout_seconds)",
    )


class _SmtpSend:
    """A send in flight (or waiting for one of its provider's threads): the dispatcher's handle.
    `on_result` is called once, on the event loop: with the thread's result, or with a timeout at
    the deadline; never after `cancel()`. Deadline and cancel abort the connection."""

    __slots__ = ("provider", "message", "on_result", "loop", "timer", "session", "future", "done")

    def __init__(
        self, provider: SmtpProvider, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]
    ) -> None:
        self.provider = provider
        self.message = message
        self.on_result = on_result
        self.loop = asyncio.get_running_loop()
        self.timer = self.loop.call_later(provider.timeout, self._expire)
        self.session: _Session | None = None
        self.future: Future | None = None
        self.done = False

    def cancel(self) -> None:
        if self.done:
            return
        self.done = True
        self.timer.cancel()
        self._abort()

    def _expire(self) -> None:
        if self.done:
            return
        self.done = True
        self._abort()
        self.on_result(_timed_out(self.provider.timeout))

    def _abort(self) -> None:
        if self.future is not None:
            self.future.cancel()  # still queued for a thread: it never starts
        if self.session is not None:
            self.session.abort()  # running: its thread errors out now; its result is dropped

    def start(self) -> None:
        """Hand the send to a thread (its provider has a slot for it)."""
        self.session = session = _Session()
        remaining = max(0.001, self.timer.when() - self.loop.time())
        self.future = thread_pool().submit(self.provider._send_blocking, self.message, session, remaining)
        self.future.add_done_callback(self._thread_done)

    def _thread_done(self, future: Future) -> None:  # in the send's thread (or here, if cancelled)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._finished, future)

    def _finished(self, future: Future) -> None:
        self.provider._release_slot()
        if self.done:
            return
        self.done = True
        self.timer.cancel()
        try:
            result = future.result()
        except BaseException as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            result = self.provider._failure(exc)
        self.on_result(result)


class SmtpProvider(BaseProvider):
    kind = "smtp"
    options = ("ssl_context", "provider_id")

    def __init__(
        self,
        config: dict,
        secrets: dict,
        *,
        ssl_context: ssl.SSLContext | None = None,
        provider_id: int | None = None,
    ) -> None:
        super().__init__(config, secrets)
        self.provider_id = provider_id  # names the provider in VERP return paths (providers.verp)
        self.host = self.config["host"]
        self.use_ssl = bool(self.config.get("use_ssl"))
        self.use_tls = bool(self.config.get("use_tls"))
        self.port = int(self.config.get("port") or default_port(self.use_tls, self.use_ssl))
        self.from_email = self.config["from_email"]
        self.username = self.config.get("username") or ""
        self.timeout = float(self.config.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)
        self._ssl_context = ssl_context
        self._threads_allowed = int(getattr(settings, "OMNIPOST_SMTP_THREADS_PER_PROVIDER", 8))
        self._threads_used = 0
        self._waiting: deque[_SmtpSend] = deque()

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        config, secrets = as_dict(config, "config"), as_dict(secrets, "secrets")
        allowed = ("host", "port", "use_tls", "use_ssl", "from_email", "username", "timeout_seconds")
        reject_unknown_keys(config, allowed, section="config")
        reject_unknown_keys(secrets, ("password",), section="secrets")
        host = config.get("host")
        if not isinstance(host, str) or not host or any(not c.isprintable() or c in " /\\@" for c in host):
            raise config_error("host", "required: the SMTP server's host name or IP address, without whitespace")
        host = host.strip("[]")
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
        timeout = config.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
            raise config_error("timeout_seconds", "must be a number of seconds (the whole SMTP dialogue's deadline)")
        if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
            raise config_error("timeout_seconds", f"must be greater than 0 and at most {MAX_TIMEOUT_SECONDS:g}")
        if check_destination:
            check_destination_host(host, port, "host")
        return {
            "host": host,
            "port": port,
            "use_tls": use_tls,
            "use_ssl": use_ssl,
            "from_email": from_email,
            "username": username,
            "timeout_seconds": float(timeout),
        }

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        future = asyncio.get_running_loop().create_future()
        handle = self.start_send(message, lambda result: future.done() or future.set_result(result))
        try:
            return await future
        except asyncio.CancelledError:
            handle.cancel()  # closes the connection now, not when the thread next wakes
            raise

    def start_send(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> _SmtpSend:
        send = _SmtpSend(self, message, on_result)
        self._waiting.append(send)
        self._start_waiting()
        return send

    def _start_waiting(self) -> None:
        while self._waiting and self._threads_used < self._threads_allowed:
            send = self._waiting.popleft()
            if send.done:  # expired or cancelled while it waited
                continue
            self._threads_used += 1
            send.start()

    def _release_slot(self) -> None:
        self._threads_used -= 1
        self._start_waiting()

    def _build(self, message: OutboundMessage) -> EmailMessage:
        # A List-Unsubscribe URL is one long word: folded at 78 columns it would become encoded-words,
        # which no mail client reads as a URL; RFC 5322's limit is 998.
        email = EmailMessage(policy=_LONG_LINES) if message.headers else EmailMessage()
        email["From"] = self.from_email
        email["To"] = message.recipient
        email["Subject"] = message.subject
        email["Date"] = formatdate(message.created_at.timestamp(), usegmt=True)
        domain = self.from_email.rpartition("@")[2] or "omnipost"
        email["Message-ID"] = f"<{message.notification_id}@{domain}>"
        email["X-OmniPost-Notification-Id"] = message.notification_id
        for name, value in message.headers:
            email[name] = value
        email.set_content(message.body)
        if message.html_body:  # multipart/alternative: the text part first, the HTML part (preferred) last
            email.add_alternative(message.html_body, subtype="html")
        return email

    def _send_blocking(self, message: OutboundMessage, session: _Session, timeout: float) -> DeliveryResult:
        try:
            return self._dialogue(message, session, timeout)
        finally:
            session.release()

    def _dialogue(self, message: OutboundMessage, session: _Session, timeout: float) -> DeliveryResult:
        try:
            validate_email(message.recipient)
        except DjangoValidationError:
            return DeliveryResult(
                delivered=False, error_code="invalid_recipient", message="not an email address", permanent=True
            )
        try:
            email = self._build(message)
            envelope_from = verp.return_path(self.provider_id, message.notification_id) or self.from_email
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
            return self._deliver(self._connect(infos, session, timeout), email, envelope_from, message.recipient)
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

    def _connect(self, infos: list[tuple], session: _Session, timeout: float) -> smtplib.SMTP:
        """Open a session to the first checked address that accepts a connection."""
        context = self._ssl_context or tls_context()
        refused: OSError | None = None
        for info in infos:
            try:
                if self.use_ssl:
                    return _PinnedSMTPSSL(
                        address=info[4], session=session, host=self.host, port=self.port, timeout=timeout,
                        context=context,
                    )  # fmt: skip
                return _PinnedSMTP(address=info[4], session=session, host=self.host, port=self.port, timeout=timeout)
            except OSError as exc:
                if isinstance(exc, smtplib.SMTPException | ssl.SSLError | TimeoutError | _Aborted):
                    raise  # the server answered (or hung): trying another address would not help
                refused = exc
        raise refused or ConnectionRefusedError(f"no address of {self.host} accepted a connection")

    def _deliver(self, client: smtplib.SMTP, email: EmailMessage, envelope_from: str, recipient: str) -> DeliveryResult:
        context = self._ssl_context or tls_context()
        try:
            if self.use_tls:
                client.starttls(context=context)
            if self.username:
                client.login(self.username, self.secrets.get("password", ""))
            client.send_message(email, from_addr=envelope_from, to_addrs=[recipient])
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
