"""A small asyncio HTTP/1.1 client built for many small signed POSTs per second.

Why it exists rather than httpx or aiohttp: measured, see core/http/__init__.py. It does only what
delivery needs:

- a keep-alive pool per (scheme, host, port) with a maximum size and FIFO waiting requests; a
  connection set free takes the next one itself;
- two ways to send: `start()` calls back once with the response or the error (no task, coroutine or
  future per request: the dispatcher's hot path), `send()`/`request()` are awaitables over it;
- one deadline per request covering pool wait, DNS, connect, TLS, write and response;
- Content-Length, chunked and close-delimited response bodies, `Connection: close`, 1xx skipped;
- TLS via ssl.create_default_context() with SNI and hostname verification;
- a guard on the resolved addresses (the providers' SSRF check): the host is resolved with
  loop.getaddrinfo(), the guard sees every candidate, and the socket connects to a checked IP (the
  Host header and SNI keep the name), so DNS rebinding cannot redirect the connection.

It never follows redirects and never retries a request except once when a reused keep-alive
connection turns out to have been closed by the server before any byte of a response arrived.
Exceptions are HttpError subclasses with stable codes, or whatever the guard raises.
Not supported, because delivery does not need them: HEAD, pipelining, streamed request bodies,
proxies, HTTP/2, cookies, decompression. The response parser is held to h11's verdicts by
tests/core/test_http_conformance.py.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import unicodedata
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
DEFAULT_MAX_BODY_BYTES = 256 * 1024
USER_AGENT = "OmniPost/1.0"


class HttpError(Exception):
    """A request that got no usable response, with a stable `code` (the providers turn it into a
    DeliveryResult the way they turn a DeliveryError into one: same attributes)."""

    code: str = "http_error"
    permanent: bool | None = None
    retry_after: float | None = None
    http_status: int | None = None


class HttpTimeout(HttpError):
    code = "timeout"


class HttpConnectError(HttpError):
    code = "connect_error"


class HttpDnsError(HttpError):
    code = "dns_error"


class HttpTlsError(HttpError):
    code = "tls_error"


class HttpProtocolError(HttpError):
    code = "protocol_error"


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str  # lower-case, IDNA-encoded, without brackets
    port: int
    host_header: bytes  # as sent in `Host:`

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)


@lru_cache(maxsize=1)
def default_ssl_context() -> ssl.SSLContext:
    """The system trust store with hostname checking, shared: loading it costs milliseconds."""
    return ssl.create_default_context()


# Whitespace and control characters never belong in a URL (RFC 3986 §2: they are percent-encoded).
# They must be refused before urlsplit, which silently drops TAB, CR and LF (WHATWG's rule), so a URL
# checked through it looked clean while the raw string, stored and echoed, kept `\r\nX-Injected: 1`.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def refuse_whitespace(text: str, what: str = "URL") -> None:
    """ValueError naming the first whitespace or control character of `text`, if any."""
    for position, ch in enumerate(text):
        if ch.isspace() or unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            raise ValueError(
                f"{what} must not contain whitespace or control characters (U+{ord(ch):04X} at position "
                f"{position}); percent-encode them"
            )


@lru_cache(maxsize=1024)
def split_url(url: str) -> tuple[Origin, str]:
    """Parse an absolute http(s) URL into its origin and request target; ValueError if unusable
    (whitespace or control characters anywhere in it included)."""
    refuse_whitespace(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError("URL must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise ValueError("URL must not contain credentials")
    host = parts.hostname
    if not host:
        raise ValueError("URL has no host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError as exc:
        raise ValueError("URL port is invalid") from exc
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError as exc:
        raise ValueError("URL host is not a valid domain name") from exc
    if any(c in host for c in " \r\n\t/\\@") or any(c in parts.path + parts.query for c in " \r\n\t"):
        raise ValueError("URL contains characters that are not allowed")
    shown = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    host_header = (shown if port == default else f"{shown}:{port}").encode("ascii")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Origin(scheme, host, port, host_header), target


@dataclass(slots=True)
class Response:
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    truncated: bool = False  # body exceeded max_body_bytes; the rest was not read

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)


# Parser states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILERS, _UNTIL_CLOSE, _IDLE = range(7)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses exactly one response per request (no pipelining)."""

    def __init__(self, max_body: int, inflight: set[_Connection]) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.max_body = max_body
        self.inflight = inflight  # the client's set of connections awaiting a response
        self.deadline = 0.0
        self.closed = False
        self.reusable = True
        self.requests = 0
        self.idle_since = 0.0
        self._req: _Request | None = None  # the request awaiting its response on this connection
        self._buf = bytearray()
        self._state = _IDLE
        self._got_bytes = False
        self._status = 0
        self._reason = ""
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._remaining = 0

    # asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._req is None:
            # Bytes while idle: the server misbehaves or pushes an unsolicited 408; drop the connection.
            self.reusable = False
            self.close()
            return
        self._got_bytes = True
        self._buf += data
        try:
            self._parse()
        except HttpProtocolError as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        self.reusable = False
        return False  # let the transport close; connection_lost completes or fails the request

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        req = self._req
        if req is None:
            return
        if self._state == _UNTIL_CLOSE:
            self._buf.clear()
            self._complete()
        elif not self._got_bytes:
            self.inflight.discard(self)
            self._req = None
            req.closed_before_response()
        else:
            self._fail(HttpProtocolError("connection closed in the middle of the response"))

    # request ----------------------------------------------------------------------------------
    def request(self, req: _Request) -> None:
        self._req = req
        self._state = _HEAD
        self._got_bytes = False
        self._buf.clear()
        self.requests += 1
        self.deadline = req.deadline
        self.inflight.add(self)  # the client's sweeper enforces the deadline
        self.transport.write(req.data)  # type: ignore[union-attr]

    def close(self, *, abort: bool = False) -> None:
        """`abort`: drop what is still buffered instead of flushing it (a send given up, or past its
        deadline, must not go on writing its request)."""
        self.closed = True
        self.reusable = False
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    def on_timeout(self) -> None:
        self._fail(HttpTimeout("no complete response before the timeout"), abort=True)

    def abandon(self) -> None:
        """The request was cancelled: no response is wanted, and the connection cannot be reused."""
        self._req = None
        self.inflight.discard(self)
        self.close(abort=True)

    def _fail(self, exc: Exception, *, abort: bool = False) -> None:
        self.reusable = False
        self.inflight.discard(self)
        req, self._req = self._req, None
        self.close(abort=abort)
        if req is not None:
            req.failed(exc)

    def _complete(self, truncated: bool = False) -> None:
        self.inflight.discard(self)
        if self._buf:  # bytes after the response: never pipelined, so the stream is out of sync
            self.reusable = False
        self._state = _IDLE
        body = bytes(self._body)
        self._body.clear()
        self.idle_since = self.loop.time()
        if truncated:
            self.close()
        req, self._req = self._req, None
        if req is not None:  # last: the pool may start the next request on this connection at once
            req.answered(Response(self._status, self._reason, self._headers, body, truncated))

    # parser -----------------------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self._buf
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise HttpProtocolError("response head too large")
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                if self._start_response(head):
                    continue  # 1xx: wait for the final response
                if self._state == _IDLE:
                    self._complete()
                    return
            elif state == _LENGTH:
                take = min(len(buf), self._remaining)
                if take:
                    if len(self._body) + take <= self.max_body:
                        self._body += buf[:take]
                    else:
                        self._body += buf[: max(0, self.max_body - len(self._body))]
                        del buf[:]
                        self._complete(truncated=True)
                        return
                    del buf[:take]
                    self._remaining -= take
                if self._remaining == 0:
                    self._complete()
                return
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 4096:
                        raise HttpProtocolError("chunk size line too long")
                    return
                match = _CHUNK_SIZE_LINE.fullmatch(buf, 0, end)
                if match is None:
                    raise HttpProtocolError("invalid chunk size")
                size = int(match.group(1), 16)
                del buf[: end + 2]
                if size == 0:
                    self._state = _TRAILERS
                else:
                    self._remaining = size
                    self._state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                remaining = self._remaining
                room = self.max_body - len(self._body)
                if remaining > room:  # this chunk goes over the cap: keep what fits, read no further
                    if len(buf) < room:
                        return
                    self._body += buf[:room]
                    del buf[:]
                    self._complete(truncated=True)
                    return
                if len(buf) < remaining + 2:
                    return
                if buf[remaining : remaining + 2] != b"\r\n":
                    raise HttpProtocolError("chunk not terminated by CRLF")
                self._body += buf[:remaining]
                del buf[: remaining + 2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                if buf[:2] == b"\r\n":
                    del buf[:2]
                    self._complete()
                    return
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise HttpProtocolError("trailers too large")
                    return
                del buf[: end + 4]
                self._complete()
                return
            elif state == _UNTIL_CLOSE:
                room = self.max_body - len(self._body)
                if len(buf) > room:
                    self._body += buf[:room]
                    del buf[:]
                    self._complete(truncated=True)
                    return
                self._body += buf
                del buf[:]
                return
            else:
                return

    def _start_response(self, head: bytes) -> bool:
        """Parse a status line and headers (RFC 9112's grammar, as h11 reads it); set the body state.
        True when it was a 1xx."""
        text = head.decode("latin-1")
        if _HEAD.fullmatch(text) is None:
            return self._start_unusual_response(text)
        # Checked as a whole (one regex, the common case): the lines split without further checks.
        lines = text.split("\r\n")
        version, code, reason = (lines[0].split(" ", 2) + [""])[:3]
        status = int(code)
        if status < 100:
            raise HttpProtocolError("malformed status code")
        if 100 <= status < 200 and status != 101:
            return True
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.lower()
            value = value.strip(" \t")
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return self._start_body(version[5:], status, reason, headers)

    def _start_unusual_response(self, text: str) -> bool:
        """The head did not pass the one-regex check: folded header lines (obs-fold, which a client
        must unfold), or something malformed; line by line, then."""
        lines = text.split("\r\n")
        match = _STATUS_LINE.fullmatch(lines[0])
        if match is None:
            raise HttpProtocolError("malformed status line")
        version, status, reason = match.group(1), int(match.group(2)), match.group(3) or ""
        if status < 100:
            raise HttpProtocolError("malformed status code")
        if 100 <= status < 200 and status != 101:
            return True
        headers: dict[str, str] = {}
        key = ""
        for line in lines[1:]:
            if line[:1] in (" ", "\t") and key:  # obs-fold: a continuation of the previous value
                if _FOLDED.fullmatch(line) is None:
                    raise HttpProtocolError("malformed header line")
                value = line.strip(" \t")
                if value:
                    headers[key] = f"{headers[key]} {value}" if headers[key] else value
                continue
            field = _HEADER_LINE.fullmatch(line)
            if field is None:
                raise HttpProtocolError("malformed header line")
            key, value = field.group(1).lower(), field.group(2).strip(" \t")
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return self._start_body(version, status, reason, headers)

    def _start_body(self, version: str, status: int, reason: str, headers: dict[str, str]) -> bool:
        """Keep the final response's status line and headers; choose how its body is delimited."""
        self._status = status
        self._reason = reason
        self._headers = headers
        self._body.clear()
        connection = headers.get("connection")
        if version == "1.0" or (connection is not None and "close" in _tokens(connection)):
            # HTTP/1.0 keep-alive is not worth its corner cases (h11 does not do it either)
            self.reusable = False
        if status in (204, 304) or status == 101:
            if status == 101:
                self.reusable = False
            self._state = _IDLE
        elif "transfer-encoding" in headers:
            if headers["transfer-encoding"].lower() != "chunked":  # the only coding a client must read
                raise HttpProtocolError("unsupported Transfer-Encoding")
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            length_text = headers["content-length"]
            if not (length_text.isdigit() and length_text.isascii()):
                lengths = set(_tokens(length_text))  # repeated equal values are one value
                if len(lengths) != 1:
                    raise HttpProtocolError("conflicting Content-Length values")
                (length_text,) = lengths
                if not (length_text.isdigit() and length_text.isascii()):
                    raise HttpProtocolError("invalid Content-Length")
            length = int(length_text)
            self._remaining = length
            self._state = _LENGTH if length else _IDLE
        else:
            self.reusable = False
            self._state = _UNTIL_CLOSE
        return False


# RFC 9112 sections 4 and 5 (h11's _abnf.py says the same): a 3-digit status, an optional reason; a header is a
# token, a colon, optional whitespace and a value of visible characters (obs-text allowed) with
# inner spaces.
_REASON = r"[^\x00\n\r\x0b\x0c]*"
_STATUS_LINE = re.compile(r"HTTP/(1\.[0-9]) ([0-9]{3})(?: (" + _REASON + r"))?")
# A value: visible characters, obs-text, spaces and tabs (h11's OWS field-content OWS is the same
# set); stripped afterwards, so the regexes have nothing to backtrack over.
_FIELD = r"[-!#$%&'*+.^_`|~0-9a-zA-Z]+:[^\x00\n\r\x0b\x0c]*"
_HEADER_LINE = re.compile(r"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):([^\x00\n\r\x0b\x0c]*)")
_FOLDED = re.compile(r"[ \t][^\x00\n\r\x0b\x0c]*")
_HEAD = re.compile(r"HTTP/1\.[0-9] [0-9]{3}(?: " + _REASON + r")?(?:\r\n" + _FIELD + r")*")
_CHUNK_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*")


def _tokens(value: str) -> list[str]:
    return [token.strip().lower() for token in value.split(",")]


Resolver = Callable[[str, int], Awaitable[list[tuple]]]
# Called with the host and every address it resolved to, before connecting; raises to refuse them.
Guard = Callable[[str, Iterable[str]], object]


async def open_connection(
    origin: Origin, deadline: float, resolve: Resolver, guard: Guard,
    protocol_factory: Callable[[], asyncio.BaseProtocol], ssl_context: ssl.SSLContext | None,
) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:  # fmt: skip
    """A connection to `origin` before `deadline` (the loop's clock), as both clients open theirs:
    resolve (`resolve`), let `guard` refuse the addresses (SSRF, on the addresses this connects to),
    try each address in turn, then TLS with `ssl_context` (None: plain TCP) naming the origin's host.
    The transport and `protocol_factory`'s protocol; HttpDnsError, HttpConnectError, HttpTlsError or
    HttpTimeout (the whole of it past the deadline) otherwise, the socket closed."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(deadline):
            try:
                infos = await resolve(origin.host, origin.port)
            except socket.gaierror as exc:
                raise HttpDnsError(f"cannot resolve {origin.host}: {exc.strerror or exc}") from exc
            if not infos:
                raise HttpDnsError(f"cannot resolve {origin.host}: no addresses")
            guard(origin.host, [info[4][0] for info in infos])
            last: OSError | None = None
            for family, type_, proto, _, sockaddr in infos:
                sock = socket.socket(family, type_, proto)
                try:
                    sock.setblocking(False)
                    await loop.sock_connect(sock, sockaddr)
                except OSError as exc:
                    sock.close()
                    last = exc
                    continue
                except BaseException:
                    sock.close()
                    raise
                try:
                    return await loop.create_connection(
                        protocol_factory, sock=sock, ssl=ssl_context,
                        server_hostname=origin.host if ssl_context is not None else None,
                    )  # fmt: skip
                except ssl.SSLError as exc:
                    sock.close()
                    raise HttpTlsError(f"TLS handshake with {origin.host} failed: {exc}") from exc
                except BaseException:
                    sock.close()
                    raise
            raise HttpConnectError(
                f"cannot connect to {origin.host}:{origin.port}: {last.strerror if last else 'no address'}"
            ) from last
    except TimeoutError:
        raise HttpTimeout(f"connecting to {origin.host}:{origin.port} timed out") from None
OnDone = Callable[["Response | None", "BaseException | None"], object]


def _answered(response: Response | None, error: BaseException | None) -> None:
    """A finished request's `on_done`: it is called once only."""


class _Request:
    """One request from `HttpClient.start` to its callback: waiting for a connection, then awaiting
    its response on one. `on_done(response, None)` or `on_done(None, error)` is called exactly once,
    never from within `start`, and not at all after `cancel()`."""

    __slots__ = ("pool", "data", "deadline", "on_done", "conn", "reused", "retried", "done")

    def __init__(self, pool: _Pool, data: bytes, deadline: float, on_done: OnDone) -> None:
        self.pool = pool
        self.data = data
        self.deadline = deadline
        self.on_done = on_done
        self.conn: _Connection | None = None
        self.reused = False  # sent on a connection that had answered before
        self.retried = False
        self.done = False

    def cancel(self) -> None:
        """Give the request up. Waiting, it is skipped when its turn comes; sent, its connection is
        closed (the server may still have received it)."""
        if self.done:
            return
        self.done = True
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abandon()
            self.pool.discard(conn)

    def answered(self, response: Response) -> None:
        conn, self.conn = self.conn, None
        self.pool.release(conn)  # type: ignore[arg-type] - set while awaiting the response
        self.finish(response, None)

    def failed(self, error: BaseException) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.discard(conn)
        self.finish(None, error)

    def closed_before_response(self) -> None:
        """The server closed the connection before any byte of the response: a keep-alive
        connection it dropped while idle is replaced once; anything else is a connection error."""
        conn, self.conn = self.conn, None
        self.pool.discard(conn)  # type: ignore[arg-type]
        if self.reused and not self.retried and not self.done:
            self.retried = True
            self.pool.dispatch(self)
            return
        self.finish(None, HttpConnectError("connection closed before any response"))

    def finish(self, response: Response | None, error: BaseException | None) -> None:
        if self.done:
            return
        self.done = True
        # dropped: a caller that keeps this request in what on_done holds (a handle to cancel it)
        # would otherwise make a reference cycle of each request, left to the cyclic collector
        on_done, self.on_done = self.on_done, _answered
        try:
            on_done(response, error)
        except Exception as exc:  # noqa: BLE001 - the caller's bug must not break the pool or the sweeper
            self.pool.client._loop.call_exception_handler(
                {"message": "HTTP request callback failed", "exception": exc}
            )


class _Pool:
    """Connections to one origin: idle ones (LIFO), a size limit, and the requests waiting (FIFO)
    for a connection. A connection set free takes the next waiting request at once."""

    def __init__(self, client: HttpClient, origin: Origin) -> None:
        self.client = client
        self.origin = origin
        self.idle: list[_Connection] = []
        self.all: set[_Connection] = set()  # open connections, idle or busy, for close()
        self.size = 0  # open connections and connections being opened
        # The client's sweeper fails the waiting requests past their deadline, so waiting costs no
        # timer per request.
        self.waiters: deque[_Request] = deque()
        # True while the waiters' deadlines never decrease (one timeout per origin, the usual case):
        # the expired ones are then at the left, and a sweep looks at those only.
        self._deadlines_in_order = True

    def take_idle(self) -> _Connection | None:
        """A live idle connection, if there is one (closing the stale ones found on the way)."""
        idle = self.idle
        if idle:
            now = self.client._loop.time()
            expiry = self.client.keepalive_expiry
            while idle:
                conn = idle.pop()
                if conn.reusable and not conn.closed and now - conn.idle_since < expiry:
                    return conn
                conn.close()
                self.all.discard(conn)
                self.size -= 1
        return None

    def dispatch(self, req: _Request) -> None:
        """Send on an idle connection, or open one within the size limit, or wait (FIFO)."""
        if self.client._closed:
            self.client._loop.call_soon(req.finish, None, HttpConnectError("client closed"))
            return
        conn = self.take_idle()
        if conn is not None:
            self.issue(req, conn)
        elif self.size < self.client.max_connections_per_host:
            self.size += 1
            self.client._open(self, req)
        else:
            waiters = self.waiters
            if not waiters:
                self._deadlines_in_order = True
            elif req.deadline < waiters[-1].deadline:
                self._deadlines_in_order = False
            waiters.append(req)
            self.client._ensure_sweeper()

    def issue(self, req: _Request, conn: _Connection) -> None:
        req.conn = conn
        req.reused = conn.requests > 0
        self.client._ensure_sweeper()
        try:
            conn.request(req)
        except Exception as exc:  # noqa: BLE001 - a transport closed under us (uvloop raises on write)
            conn._fail(HttpConnectError(f"could not send the request: {exc}"))

    def opened(self, req: _Request, conn: _Connection) -> None:
        """A connection opened for `req`; given on if `req` was cancelled meanwhile."""
        if self.client._closed or conn.closed:
            conn.close()
            problem = "client closed" if self.client._closed else "connection closed as it opened"
            self.not_opened(req, HttpConnectError(problem))
            return
        self.all.add(conn)
        if req.done:
            self.release(conn)
        else:
            self.issue(req, conn)

    def not_opened(self, req: _Request, error: BaseException) -> None:
        self.size -= 1
        self._hand_slot()
        req.finish(None, error)

    def release(self, conn: _Connection) -> None:
        if not conn.reusable or conn.closed or self.client._closed:
            self.discard(conn)
            return
        waiters = self.waiters
        while waiters:
            req = waiters.popleft()
            if not req.done:
                self.issue(req, conn)
                return
        self.idle.append(conn)

    def discard(self, conn: _Connection) -> None:
        conn.close()
        if conn in self.all:  # once per connection, whoever notices first
            self.all.discard(conn)
            self.size -= 1
            self._hand_slot()

    def _hand_slot(self) -> None:
        """A connection closed: the first waiting request gets a new one."""
        waiters = self.waiters
        while waiters and self.size < self.client.max_connections_per_host:
            req = waiters.popleft()
            if not req.done:
                self.size += 1
                self.client._open(self, req)
                return

    def close(self) -> None:
        """Close every connection; requests in flight on them fail with a connection error."""
        for conn in self.all:
            conn.close()
        self.size -= len(self.all)
        self.idle.clear()
        self.all.clear()
        waiters, self.waiters = self.waiters, deque()
        for req in waiters:
            req.finish(None, HttpConnectError("client closed"))

    def expire_waiters(self, now: float) -> None:
        """Fail the waiting requests whose deadline has passed (called by the client's sweeper, 40
        times a second, with up to concurrency − pool size waiters: thousands)."""
        waiters = self.waiters
        if self._deadlines_in_order:
            while waiters and (waiters[0].deadline <= now or waiters[0].done):
                _time_out(waiters.popleft())  # a callback may append to the right: not iterated over
            return
        if not any(req.deadline <= now for req in waiters):
            return
        expired = [req for req in waiters if req.deadline <= now]
        self.waiters = deque(req for req in waiters if req.deadline > now)
        for req in expired:  # after the swap: what a callback starts joins the new deque
            _time_out(req)


def _time_out(req: _Request) -> None:
    req.finish(None, HttpTimeout("no free connection in the pool before the timeout"))


class HttpClient:
    """A keep-alive HTTP/1.1 client bound to the event loop that first uses it.

    Used from a different loop later (tests calling asyncio.run() twice), it drops the old loop's
    connections and starts afresh; within one loop it is not thread-safe, like asyncio itself.
    """

    def __init__(
        self,
        *,
        max_connections_per_host: int = 256,
        keepalive_expiry: float = 4.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        guard: Guard,
        ssl_context: ssl.SSLContext | None = None,
        resolver: Resolver | None = None,
        timeout_resolution: float = 0.025,
    ) -> None:
        """`guard(host, addresses)` runs at every new connection on what the host resolved to and
        raises to refuse it (the providers pass the SSRF check: providers.transport);
        the connection then goes to a checked address, never through a second lookup.

        Response deadlines are enforced by one sweep every `timeout_resolution` seconds rather than
        a timer per request: at >10k requests/s with 10 s timeouts, per-request timers keep a heap of
        ~100k cancelled handles and cost about a third of the throughput.
        """
        self.max_connections_per_host = max_connections_per_host
        # Below the common 5 s server keep-alive timeout, so we rarely reuse a socket being closed.
        self.keepalive_expiry = keepalive_expiry
        self.max_body_bytes = max_body_bytes
        self.guard = guard
        self._ssl_context = ssl_context
        self._resolver = resolver
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # type: ignore[assignment]
        self._closed = False
        self._inflight: set[_Connection] = set()
        self._opening: set[asyncio.Task] = set()  # connections being opened (kept from the collector)
        self._sweeper: asyncio.TimerHandle | None = None
        self.timeout_resolution = timeout_resolution

    @property
    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = default_ssl_context()
        return self._ssl_context

    def connection_count(self) -> int:
        return sum(pool.size for pool in self._pools.values())

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes = b"",
        timeout: float = 10.0,
    ) -> Response:
        """Convenience form: build the request head from a URL and headers, then send it."""
        origin, target = split_url(url)
        return await self.send(origin, build_head(method, origin, target, headers, len(body)), body, timeout)

    async def send(self, origin: Origin, head: bytes, body: bytes, timeout: float) -> Response:
        """Send a prebuilt request head (ending in CRLFCRLF) and body; return the response.

        No URL parsing, no header dicts. `timeout` bounds everything."""
        fut = asyncio.get_running_loop().create_future()

        def done(response: Response | None, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is None:
                fut.set_result(response)
            else:
                fut.set_exception(error)

        req = self.start(origin, head, body, timeout, done)
        try:
            return await fut
        except asyncio.CancelledError:
            req.cancel()
            raise

    def start(self, origin: Origin, head: bytes, body: bytes, timeout: float, on_done: OnDone) -> _Request:
        """`send` without a coroutine, a task or a future, for the dispatcher's hot path: the request
        starts now and `on_done(response, None)` or `on_done(None, error)` follows once, on the event
        loop (never from within this call); `cancel()` on the returned request gives it up.
        Raises HttpConnectError at once if the client is closed."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._rebind(loop)
        if self._closed:
            raise HttpConnectError("client closed")
        pool = self._pools.get(origin.key)
        if pool is None:
            pool = self._pools[origin.key] = _Pool(self, origin)
        req = _Request(pool, head + body if body else head, loop.time() + timeout, on_done)
        pool.dispatch(req)
        return req

    def _open(self, pool: _Pool, req: _Request) -> None:
        """Open a connection for `req` (its slot in the pool is counted already)."""
        task = self._loop.create_task(self._open_for(pool, req))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    async def _open_for(self, pool: _Pool, req: _Request) -> None:
        try:
            conn = await self._connect(pool.origin, req.deadline)
        except asyncio.CancelledError:
            pool.not_opened(req, HttpConnectError("client closed"))
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the request's callback
            pool.not_opened(req, exc)
            return
        pool.opened(req, conn)

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(self.timeout_resolution, self._sweep)

    def _sweep(self) -> None:
        now = self._loop.time()
        try:
            # Waiters first: a connection that times out now hands its slot on at once, and a
            # waiter past its deadline should fail as one, not open a connection for nothing.
            # Over copies: the callbacks run here may start requests (new pools, new waiters).
            for pool in list(self._pools.values()):
                if pool.waiters:
                    pool.expire_waiters(now)
            for conn in [conn for conn in self._inflight if conn.deadline <= now]:
                conn.on_timeout()
        finally:
            if self._inflight or any(pool.waiters for pool in self._pools.values()):
                self._sweeper = self._loop.call_later(self.timeout_resolution, self._sweep)
            else:
                self._sweeper = None

    def _rebind(self, loop: asyncio.AbstractEventLoop) -> None:
        """First use, or reuse from another event loop: connections of the old loop are useless.

        If the old loop is already closed its transports cannot be closed through it; they are
        dropped and their sockets closed when garbage-collected.
        """
        old = self._loop
        if old is not None and not old.is_closed():
            for task in self._opening:
                task.cancel()
            for pool in list(self._pools.values()):
                pool.close()
        self._pools.clear()
        self._inflight.clear()
        self._opening.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._loop = loop

    async def _resolve(self, host: str, port: int) -> list[tuple]:
        if self._resolver is not None:
            return await self._resolver(host, port)
        return await self._loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)

    async def _connect(self, origin: Origin, deadline: float) -> _Connection:
        _, conn = await open_connection(
            origin, deadline, self._resolve, self.guard,
            lambda: _Connection(self.max_body_bytes, self._inflight), self.ssl_context if origin.tls else None,
        )  # fmt: skip
        return conn

    async def aclose(self) -> None:
        if asyncio.get_running_loop() is not self._loop:
            self._rebind(asyncio.get_running_loop())
        self._closed = True
        for task in self._opening:
            task.cancel()
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None


def build_head(
    method: str,
    origin: Origin,
    target: str,
    headers: dict[str, str] | Iterable[tuple[str, str]] = (),
    content_length: int | None = None,
    *,
    final: bool = True,
) -> bytes:
    """Serialise a request head. With `final=False` the result is a prefix that the caller
    completes with more header lines and the terminating blank line (the webhook hot path)."""
    items = headers.items() if isinstance(headers, dict) else headers
    lines = [f"{method} {target} HTTP/1.1", f"Host: {origin.host_header.decode('ascii')}"]
    names = set()
    for name, value in items:
        if any(c in name or c in value for c in "\r\n\0") or ":" in name:
            raise ValueError("header names and values must not contain CR, LF, NUL (or ':' in names)")
        names.add(name.lower())
        lines.append(f"{name}: {value}")
    if "user-agent" not in names:
        lines.append(f"User-Agent: {USER_AGENT}")
    if final:
        if content_length is not None:
            lines.append(f"Content-Length: {content_length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")
