"""Loopback receivers for delivery tests and benchmarks: a webhook HTTP server and an SMTP sink.

In-process (each runs its own event loop in a daemon thread)::

    with HttpReceiver(secret=SECRET, status=503, retry_after="7") as rx:
        ... deliver to rx.url ...
        rx.wait_for(1); rx.requests[0].verified; rx.configure(status=200)

    with SmtpSink(auth=("user", "pw"), reject={"bad@example.com": "550 5.1.1 no such user"}) as sink:
        ... sink.messages[0].message["Subject"] ...

As a subprocess (prints JSON lines: `listening` with the port, optional periodic `stats`, and a
final `stopped` with the counts; stops by itself after --max-seconds, --idle-seconds or --expect)::

    python -m tests.support.receivers --port 0 --secret whsec_... --delay-ms 5 --rate-limit 1000
    python -m tests.support.receivers --smtp --port 0 --auth user:pw

`spawn_receiver(...)` starts that subprocess and hands back its port and final counts. A running
HTTP receiver also answers `GET /_stats` (the counts as JSON) and `POST /_config` (a JSON object of
behaviour changes, e.g. {"status": 200}) so other processes can watch and steer it.

The HTTP receiver verifies every request with `standardwebhooks.Webhook(secret).verify()` when
it has a secret and answers 400 to a request whose signature does not verify.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import email
import email.policy
import json
import logging
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, fields
from email.message import EmailMessage
from functools import lru_cache
from http import HTTPStatus
from pathlib import Path
from typing import Any

from benchmarks.tls import TlsMaterial, make_tls_material  # noqa: F401 - re-exported: the tests import them here

# A fixed secret for tests: whsec_ + base64 of 32 bytes.
TEST_SIGNING_SECRET = "whsec_" + base64.b64encode(bytes(range(1, 33))).decode()


# --------------------------------------------------------------------------------------------
# A private event loop in a daemon thread
# --------------------------------------------------------------------------------------------
class _LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


# --------------------------------------------------------------------------------------------
# Webhook HTTP receiver
# --------------------------------------------------------------------------------------------
@dataclass
class HttpBehaviour:
    status: int = 200  # answer for every request once `responses` is used up
    responses: list[int] = field(default_factory=list)  # consumed first, one per webhook request
    delay_ms: float = 0.0  # wait this long before answering
    retry_after: str | None = None  # Retry-After header on every non-2xx answer
    rate_limit: float | None = None  # answer 429 (Retry-After: 1) above this many requests per second
    location: str | None = None  # Location header on 3xx answers
    close: bool = False  # `Connection: close` after every answer
    chunked: bool = False  # chunked response bodies
    body: bytes = b'{"ok":true}'  # body of 2xx answers
    error_body: bytes | None = None  # body of other answers (default {"error": <status>})
    headers: dict[str, str] = field(default_factory=dict)  # extra headers on every answer (X-Message-Id, ...)


@dataclass
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    status: int  # what the receiver answered
    verified: bool | None  # None when the receiver has no secret
    received_at: float

    @property
    def payload(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def webhook_id(self) -> str | None:
        return self.headers.get("webhook-id")


class _Stats:
    def __init__(self) -> None:
        self.requests = 0
        self.verified = 0
        self.unverified = 0  # skipped by verify_every
        self.invalid_signature = 0
        self.accepted = 0
        self.by_status: Counter[int] = Counter()
        self.seen_ids: set[str] = set()
        self.accepted_ids: set[str] = set()
        self.duplicate_accepts = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.connections = 0

    def as_dict(self) -> dict[str, Any]:
        span = (self.last_at - self.first_at) if self.first_at and self.last_at else 0.0
        return {
            "requests": self.requests,
            "verified": self.verified,
            "unverified": self.unverified,
            "invalid_signature": self.invalid_signature,
            "accepted": self.accepted,
            "unique_ids": len(self.seen_ids),
            "accepted_unique": len(self.accepted_ids),
            "duplicate_accepts": self.duplicate_accepts,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "first_to_last_seconds": round(span, 6),
            "connections": self.connections,
        }


class _HttpProtocol(asyncio.Protocol):
    def __init__(self, receiver: HttpReceiver) -> None:
        self.receiver = receiver
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.receiver._connections.add(self)
        with self.receiver._lock:
            self.receiver._stats.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.receiver._connections.discard(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._process()

    def _process(self) -> None:
        while self.transport is not None and not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > 65536:
                    self.transport.close()
                return
            head = self.buf[:end].decode("latin-1")
            headers = {name.lower(): value.rstrip() for name, value in _HEADER_RE.findall(head)}
            if "chunked" in headers.get("transfer-encoding", ""):
                self._write(411, b'{"error":"send Content-Length"}', {}, close=True)
                return
            length = int(headers.get("content-length") or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            method, _, rest = head.split("\r\n", 1)[0].partition(" ")
            path = rest.rpartition(" ")[0] or rest
            status, extra, out, delay = self.receiver._handle(method, path, headers, body)
            close = headers.get("connection", "").lower() == "close"
            if delay > 0:
                self.busy = True
                asyncio.get_running_loop().call_later(delay, self._delayed, status, out, extra, close)
                return
            self._write(status, out, extra, close)

    def _delayed(self, status: int, out: bytes, extra: dict[str, str], close: bool) -> None:
        self.busy = False
        if self.transport is None:
            return
        self._write(status, out, extra, close)
        self._process()

    def _write(self, status: int, body: bytes, extra: dict[str, str], close: bool) -> None:
        behaviour = self.receiver.behaviour
        close = close or behaviour.close
        self.transport.write(_render(status, tuple(extra.items()), close, behaviour.chunked, body))  # type: ignore[union-attr]
        if close:
            self.transport.close()  # type: ignore[union-attr]


_HEADER_RE = re.compile(r"\r\n([^:\r\n]+):[ \t]*([^\r\n]*)")


@lru_cache(maxsize=256)
def _render(status: int, extra: tuple[tuple[str, str], ...], close: bool, chunked: bool, body: bytes) -> bytes:
    """A complete HTTP response; cached because a receiver mostly repeats the same few answers."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in extra]
    if close:
        head.append("Connection: close")
    if chunked and body:
        head.append("Transfer-Encoding: chunked")
        half = len(body) // 2 or len(body)
        payload = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:half], body[half:]) if c) + b"0\r\n\r\n"
    else:
        head.append(f"Content-Length: {len(body)}")
        payload = body
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload


class HttpReceiver:
    """A webhook receiver on loopback that verifies signatures and records what it received."""

    def __init__(
        self,
        *,
        secret: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        path: str = "/hook",
        max_seconds: float = 60.0,
        record: bool = True,
        ssl_context: ssl.SSLContext | None = None,
        on_request: Callable[[ReceivedRequest], None] | None = None,
        verify_every: int = 1,
        **behaviour: Any,
    ) -> None:
        """`verify_every=N` checks the signature of every N-th request only (benchmarks on small boxes);
        the others are recorded with verified=None and answered as if valid."""
        from standardwebhooks import Webhook

        self.host = host
        self.port = port
        self.path = path
        self.max_seconds = max_seconds
        self.record = record
        self.ssl_context = ssl_context
        self.on_request = on_request
        self.behaviour = HttpBehaviour(**behaviour)
        self._verifier = Webhook(secret) if secret else None
        self.verify_every = max(1, verify_every)
        self._verify_counter = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stats = _Stats()
        self._requests: list[ReceivedRequest] = []
        self._connections: set[_HttpProtocol] = set()
        self._rate_second = -1
        self._rate_count = 0
        self._server: asyncio.AbstractServer | None = None
        self._thread: _LoopThread | None = None
        self.stopped = asyncio.Event()  # bound lazily to whichever loop serves
        self.expired = False

    # lifecycle ---------------------------------------------------------------------------------
    async def start_async(self) -> HttpReceiver:
        """Serve on the running loop (used by the subprocess mode and by the thread runner)."""
        loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        self._server = await loop.create_server(
            lambda: _HttpProtocol(self), self.host, self.port, ssl=self.ssl_context, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]
        loop.call_later(self.max_seconds, self._expire)
        return self

    def _expire(self) -> None:
        self.expired = True
        self.close_now()

    def close_now(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            if conn.transport is not None:
                conn.transport.close()
        self.stopped.set()

    def start(self) -> HttpReceiver:
        self._thread = _LoopThread("http-receiver")
        self._thread.start()
        self._thread.run(self.start_async())
        return self

    async def _shutdown(self) -> None:
        self.close_now()
        if self._server is not None:
            await self._server.wait_closed()
        await asyncio.sleep(0)  # let transports finish closing

    def stop(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(Exception):
                self._thread.run(self._shutdown(), timeout=5)
            self._thread.stop()
            self._thread = None

    def __enter__(self) -> HttpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # inspection and control --------------------------------------------------------------------
    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://{self.host}:{self.port}{self.path}"

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._requests)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self._stats.as_dict()

    def configure(self, **changes: Any) -> None:
        """Change behaviour while running, e.g. configure(status=200, delay_ms=0)."""
        with self._lock:
            for name, value in changes.items():
                if name not in {f.name for f in fields(HttpBehaviour)}:
                    raise TypeError(f"unknown behaviour {name!r}")
                setattr(self.behaviour, name, value)

    def drop_connections(self) -> None:
        """Close every open connection from the server side (as a server's idle timeout would)."""
        if self._thread is not None:

            async def drop() -> None:
                for conn in list(self._connections):
                    if conn.transport is not None:
                        conn.transport.close()
                await asyncio.sleep(0)

            self._thread.run(drop())

    def wait_for(self, count: int, timeout: float = 5.0) -> bool:
        """Block until at least `count` webhook requests arrived (True) or the timeout passed."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._stats.requests < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    # request handling (runs on the receiver's loop) --------------------------------------------
    def _handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple:
        if path == "/_stats":
            return 200, {}, json.dumps(self.stats()).encode(), 0.0
        if path == "/_config" and method == "POST":
            try:
                self.configure(**json.loads(body or b"{}"))
            except (TypeError, ValueError) as exc:
                return 400, {}, json.dumps({"error": str(exc)}).encode(), 0.0
            return 200, {}, b'{"ok":true}', 0.0
        verified: bool | None = None
        self._verify_counter += 1
        if self._verifier is not None and self._verify_counter % self.verify_every == 0:
            try:
                self._verifier.verify(body, headers, json_parse=False)
                verified = True
            except Exception:  # noqa: BLE001 - any verification failure is recorded, not raised
                verified = False
        now = time.monotonic()
        with self._changed:
            b = self.behaviour
            extra: dict[str, str] = dict(b.headers)
            if verified is False:
                status = 400
            elif b.rate_limit is not None and self._over_rate(now, b.rate_limit):
                status, extra = 429, {"Retry-After": "1"}
            else:
                status = b.responses.pop(0) if b.responses else b.status
            if not 200 <= status < 300 and b.retry_after is not None and "Retry-After" not in extra:
                extra["Retry-After"] = b.retry_after
            if 300 <= status < 400 and b.location:
                extra["Location"] = b.location
            stats = self._stats
            stats.requests += 1
            stats.by_status[status] += 1
            stats.first_at = stats.first_at or now
            stats.last_at = now
            if verified:
                stats.verified += 1
            elif verified is False:
                stats.invalid_signature += 1
            webhook_id = headers.get("webhook-id")
            if webhook_id:
                stats.seen_ids.add(webhook_id)
            if 200 <= status < 300:
                stats.accepted += 1
                if webhook_id:
                    if webhook_id in stats.accepted_ids:
                        stats.duplicate_accepts += 1
                    stats.accepted_ids.add(webhook_id)
            if verified is None and self._verifier is not None:
                stats.unverified += 1
            request = ReceivedRequest(method, path, headers, body, status, verified, time.time())
            if self.record:
                self._requests.append(request)
            self._changed.notify_all()
            if 200 <= status < 300:
                out = b.body
            else:
                out = b.error_body if b.error_body is not None else json.dumps({"error": status}).encode()
            delay = b.delay_ms / 1000.0
        if self.on_request is not None:
            self.on_request(request)
        return status, extra, out, delay

    def _over_rate(self, now: float, limit: float) -> bool:
        second = int(now)
        if second != self._rate_second:
            self._rate_second, self._rate_count = second, 0
        self._rate_count += 1
        return self._rate_count > limit


# --------------------------------------------------------------------------------------------
# SMTP sink
# --------------------------------------------------------------------------------------------
@dataclass
class ReceivedMail:
    mail_from: str
    rcpt_tos: list[str]
    raw: bytes
    authenticated_as: str | None
    tls: bool

    @property
    def message(self) -> EmailMessage:
        raw = self.raw.replace(b"\r\n", b"\n")  # SMTP line endings; the parser keeps CR in bodies
        return email.message_from_bytes(raw, policy=email.policy.default)  # type: ignore[return-value]


class _SinkHandler:
    def __init__(self, sink: SmtpSink) -> None:
        self.sink = sink

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        sink = self.sink
        reply = sink.reject.get(address.lower()) or sink.reject_all
        if reply:
            with sink._lock:
                sink.rejected.append(address)
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        sink = self.sink
        if sink.data_reply:
            return sink.data_reply
        raw = envelope.original_content or envelope.content
        login = getattr(session, "auth_data", None)
        mail = ReceivedMail(
            mail_from=envelope.mail_from,
            rcpt_tos=list(envelope.rcpt_tos),
            raw=raw if isinstance(raw, bytes) else str(raw).encode(),
            authenticated_as=login.decode() if isinstance(login, bytes) else login,
            tls=session.ssl is not None or server.transport.get_extra_info("ssl_object") is not None,
        )
        with sink._changed:
            sink.messages.append(mail)
            sink._changed.notify_all()
        return "250 Message accepted for delivery"


class SmtpSink:
    """An aiosmtpd server on loopback recording every accepted message."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        auth: tuple[str, str] | None = None,
        reject: dict[str, str] | None = None,
        reject_all: str | None = None,
        data_reply: str | None = None,
        starttls_context: ssl.SSLContext | None = None,
        implicit_tls_context: ssl.SSLContext | None = None,
        max_seconds: float = 60.0,
    ) -> None:
        """`reject` maps a recipient to the reply for RCPT (e.g. "550 5.1.1 no such user");
        `data_reply` replaces the answer to DATA (e.g. "451 4.3.0 try later")."""
        self.host = host
        self.port = port
        self.auth = auth
        self.reject = {k.lower(): v for k, v in (reject or {}).items()}
        self.reject_all = reject_all
        self.data_reply = data_reply
        self.starttls_context = starttls_context
        self.implicit_tls_context = implicit_tls_context
        self.max_seconds = max_seconds
        self.messages: list[ReceivedMail] = []
        self.rejected: list[str] = []
        self.auth_failures = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._server: asyncio.AbstractServer | None = None
        self._thread: _LoopThread | None = None
        self.stopped = asyncio.Event()

    def _authenticate(self, server, session, envelope, mechanism, auth_data):
        from aiosmtpd.smtp import AuthResult, LoginPassword

        if self.auth and isinstance(auth_data, LoginPassword):
            user, password = self.auth
            if auth_data.login.decode() == user and auth_data.password.decode() == password:
                return AuthResult(success=True, auth_data=user)
        with self._lock:
            self.auth_failures += 1
        return AuthResult(success=False, handled=False)

    async def start_async(self) -> SmtpSink:
        from aiosmtpd.smtp import SMTP

        loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        handler = _SinkHandler(self)

        logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every command at INFO

        def factory() -> SMTP:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # AUTH without TLS is deliberate on loopback
                return SMTP(
                    handler,
                    hostname="sink.omnipost.test",
                    auth_required=bool(self.auth),
                    auth_require_tls=False,
                    authenticator=self._authenticate if self.auth else None,
                    tls_context=self.starttls_context,
                    loop=loop,
                )

        self._server = await loop.create_server(factory, self.host, self.port, ssl=self.implicit_tls_context)
        self.port = self._server.sockets[0].getsockname()[1]
        loop.call_later(self.max_seconds, self.close_now)
        return self

    def close_now(self) -> None:
        if self._server is not None:
            self._server.close()
        self.stopped.set()

    def start(self) -> SmtpSink:
        self._thread = _LoopThread("smtp-sink")
        self._thread.start()
        self._thread.run(self.start_async())
        return self

    async def _shutdown(self) -> None:
        self.close_now()
        await asyncio.sleep(0.01)  # let aiosmtpd finish sessions that are closing

    def stop(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(Exception):
                self._thread.run(self._shutdown(), timeout=5)
            self._thread.stop()
            self._thread = None

    def __enter__(self) -> SmtpSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for(self, count: int, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.messages) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"messages": len(self.messages), "rejected": len(self.rejected), "auth_failures": self.auth_failures}


# --------------------------------------------------------------------------------------------
# Subprocess mode
# --------------------------------------------------------------------------------------------
def _emit(event: str, **data: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **data}) + "\n")
    sys.stdout.flush()


async def _serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    if args.smtp:
        auth = tuple(args.auth.split(":", 1)) if args.auth else None
        server: HttpReceiver | SmtpSink = SmtpSink(
            host=args.host,
            port=args.port,
            auth=auth,  # type: ignore[arg-type]
            reject={r: "550 5.1.1 no such user" for r in args.reject_rcpt},
            max_seconds=args.max_seconds,
        )
        count: Callable[[], int] = lambda: len(server.messages)  # type: ignore[union-attr]  # noqa: E731
    else:
        server = HttpReceiver(
            secret=args.secret,
            host=args.host,
            port=args.port,
            max_seconds=args.max_seconds,
            record=False,
            status=args.status,
            delay_ms=args.delay_ms,
            retry_after=args.retry_after,
            rate_limit=args.rate_limit,
            close=args.close,
            verify_every=args.verify_every,
        )
        count = lambda: len(server._stats.accepted_ids) or server._stats.accepted  # type: ignore[union-attr]  # noqa: E731
    await server.start_async()
    reason = "max_seconds"
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda s=sig: _stop(server, signal.Signals(s).name))
    _emit("listening", kind="smtp" if args.smtp else "http", host=args.host, port=server.port, pid=os.getpid())
    started = last_report = time.monotonic()
    last_count, last_change = 0, started
    while not server.stopped.is_set():
        try:
            await asyncio.wait_for(server.stopped.wait(), 0.1)
        except TimeoutError:
            pass
        now = time.monotonic()
        current = count()
        if current != last_count:
            last_count, last_change = current, now
        if args.report_every and now - last_report >= args.report_every:
            last_report = now
            _emit("stats", **server.stats())
        if args.expect and current >= args.expect:
            reason = "expected_count_reached"
            server.close_now()
        elif args.idle_seconds and current and now - last_change >= args.idle_seconds:
            reason = "idle"
            server.close_now()
    reason = getattr(server, "_stop_reason", reason)
    _emit("stopped", reason=reason, **server.stats())


def _stop(server: HttpReceiver | SmtpSink, reason: str) -> None:
    server._stop_reason = reason  # type: ignore[union-attr]
    server.close_now()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.receivers", description=__doc__.split("\n")[0])
    parser.add_argument("--smtp", action="store_true", help="run the SMTP sink instead of the webhook receiver")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on the first line)")
    parser.add_argument("--secret", default=None, help="whsec_ secret: verify every request's signature")
    parser.add_argument("--verify-every", type=int, default=1, help="verify only every N-th signature (benchmarks)")
    parser.add_argument("--status", type=int, default=200)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--retry-after", default=None)
    parser.add_argument("--rate-limit", type=float, default=None, help="answer 429 above N requests per second")
    parser.add_argument("--close", action="store_true", help="Connection: close after every response")
    parser.add_argument("--auth", default=None, help="SMTP: require AUTH as user:password")
    parser.add_argument("--reject-rcpt", action="append", default=[], help="SMTP: answer 550 for this recipient")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="stop after this long whatever happens")
    parser.add_argument("--idle-seconds", type=float, default=0.0, help="stop this long after the last request")
    parser.add_argument("--expect", type=int, default=0, help="stop once this many distinct ids were accepted")
    parser.add_argument("--report-every", type=float, default=0.0, help="print stats every N seconds")
    asyncio.run(_serve(parser.parse_args(argv)))


# --------------------------------------------------------------------------------------------
# Starting the subprocess from tests and benchmarks
# --------------------------------------------------------------------------------------------
class ReceiverProcess:
    """A receiver subprocess: `.port`, `.url`, `.stats()` (live, HTTP only) and `.stop()` (final counts)."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, startup_timeout: float = 10.0) -> None:
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.receivers", *args],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.final: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        first = self._read_event(startup_timeout)
        if not first or first.get("event") != "listening":
            self.proc.kill()
            raise RuntimeError(f"receiver did not start: {first!r}")
        self.host, self.port, self.kind = first["host"], first["port"], first["kind"]

    def _read_event(self, timeout: float) -> dict[str, Any] | None:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not result or not result[0]:
            return None
        event = json.loads(result[0])
        self.events.append(event)
        return event

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    def stats(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"http://{self.host}:{self.port}/_stats", timeout=5) as response:
            return json.loads(response.read())

    def stop(self, timeout: float = 10.0) -> dict[str, Any]:
        if self.final is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.final is None and time.monotonic() < deadline:
                event = self._read_event(max(0.1, deadline - time.monotonic()))
                if event is None:
                    break
                if event.get("event") == "stopped":
                    self.final = event
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        return self.final or {}

    def __enter__(self) -> ReceiverProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn_receiver(*args: str, env: dict[str, str] | None = None) -> ReceiverProcess:
    """Start `python -m tests.support.receivers ARGS` and wait until it listens."""
    return ReceiverProcess(list(args), env=env)


if __name__ == "__main__":
    main()
