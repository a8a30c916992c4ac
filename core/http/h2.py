"""One multiplexed HTTP/2 connection over TLS to one origin (the APNs provider's transport), framed
by core.http.h2wire.

Why not httpx[http2]: its connection pool opens connections through its own network backend, so the
SSRF guard could not see the resolved addresses (this client resolves, lets the guard check every
candidate, and connects to a checked address, as core.http.client does), and every request would
cost a task and several coroutines. Here a request is a stream started at once: `start()` calls
back once with the response or the error, on the event loop.

- one TLS connection (ALPN `h2`), opened on first use and again after it closes, the server
  sends GOAWAY or its stream ids run out (past 2^31-1: it drains as after a GOAWAY); requests wait
  (FIFO) while it opens or while the server's SETTINGS_MAX_CONCURRENT_STREAMS are all in flight;
- one deadline per request (waiting, connecting, sending, the response), kept by a sweep;
- request bodies respect flow control (sent as the windows open); response bodies are acknowledged
  as they arrive and capped at `max_body_bytes`;
- GOAWAY: the streams above its last-stream-id were never processed (RFC 9113 §6.8), so they start
  again on a new connection, as does a stream the server resets with REFUSED_STREAM; the streams at
  or below it are still answered on the old connection, which closes once they are. A stream reset
  otherwise, or in flight on
  a connection lost without a GOAWAY covering it, fails with HttpConnectError (transient: it may
  have been processed); a timed-out stream is reset (CANCEL) and fails with HttpTimeout;
- request headers are encoded without a dynamic table or Huffman and not validated again: the
  callers build them (lower-case names, values checked where they come from);
- a broken frame or header block from the server fails the connection's streams with
  HttpProtocolError (a GOAWAY says why);
- an exception from a request's callback goes to the event loop's exception handler, as in
  core.http.client: the connection reads on.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Callable
from functools import lru_cache

from core.http import h2wire
from core.http.client import (
    Guard,
    HttpConnectError,
    HttpProtocolError,
    HttpTimeout,
    Origin,
    Resolver,
    Response,
    open_connection,
)

DEFAULT_MAX_BODY_BYTES = 64 * 1024
OnResponse = Callable[[Response | None, BaseException | None], object]


@lru_cache(maxsize=8)
def h2_ssl_context(cafile: str | None = None) -> ssl.SSLContext:
    """The system trust store (or `cafile`), hostname checking, ALPN h2 only."""
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["h2"])
    return context


class H2Request:
    __slots__ = ("body", "client", "deadline", "done", "headers", "on_done", "stream_id")

    def __init__(self, client: H2Client, headers: list[tuple[bytes, bytes]], body: bytes, deadline: float,
                 on_done: OnResponse) -> None:  # fmt: skip
        self.client = client
        self.headers = headers
        self.body = body
        self.deadline = deadline
        self.on_done = on_done
        self.done = False
        self.stream_id = 0

    def finish(self, response: Response | None, error: BaseException | None) -> None:
        if self.done:
            return
        self.done = True
        self.client._live.pop(self, None)
        # dropped: a caller that keeps this request in what on_done holds would otherwise make a
        # reference cycle of each request, left to the cyclic collector
        on_done, self.on_done = self.on_done, _finished
        try:
            on_done(response, error)
        except Exception as exc:  # noqa: BLE001 - the caller's bug must not break the connection or the sweeper
            self.client._loop.call_exception_handler(  # type: ignore[union-attr] - set by start()
                {"message": "HTTP/2 request callback failed", "exception": exc}
            )

    def cancel(self) -> None:
        """Give the request up: its stream is reset; no callback follows."""
        if self.done:
            return
        self.done = True
        self.client._live.pop(self, None)
        self.on_done = _finished
        self.client._abandon(self)


def _finished(response: Response | None, error: BaseException | None) -> None:
    """A finished request's `on_done`: it is called once only."""


class _Stream:
    __slots__ = ("body", "headers", "request", "status", "truncated")

    def __init__(self, request: H2Request) -> None:
        self.request = request
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.truncated = False


class _H2Protocol(asyncio.Protocol):
    """One connection: asyncio's bytes to and from `h2wire.ClientConnection`, whose calls (`on_*`)
    answer the requests."""

    def __init__(self, client: H2Client) -> None:
        self.client = client
        self.conn = h2wire.ClientConnection(self, client.keep_headers)
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.closed = False
        self.accepting = True  # false after GOAWAY: no new streams here

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.conn.initiate()
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def capacity(self) -> int:
        if self.closed or not self.accepting:
            return 0
        return self.conn.capacity()

    def start(self, request: H2Request) -> None:
        # written by the caller's flush (one write for every stream a pump starts)
        stream_id = self.conn.send_request(request.headers, request.body)
        request.stream_id = stream_id
        self.streams[stream_id] = _Stream(request)
        if self.conn.next_stream_id > h2wire.MAX_STREAM_ID:  # the last id: drained as after a GOAWAY
            self.accepting = False
            self.client._draining(self)

    def reset(self, request: H2Request) -> None:
        self.streams.pop(request.stream_id, None)
        if self.closed:
            return
        self.conn.reset(request.stream_id)
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            self.conn.receive(data)
        except h2wire.ConnectionError_ as exc:
            self.flush()  # the GOAWAY saying why
            self._lost(HttpProtocolError(f"HTTP/2 protocol error: {exc}"))
            return
        self.flush()
        self.client._pump()

    # ClientConnection's calls

    def on_response(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.status = status
            stream.headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}

    def on_data(self, stream_id: int, data: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            room = self.client.max_body_bytes - len(stream.body)
            stream.body += data[: max(0, room)]
            stream.truncated = stream.truncated or len(data) > room

    def on_end(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            response = Response(stream.status, "", stream.headers, bytes(stream.body), stream.truncated)
            stream.request.finish(response, None)
            if not self.accepting and not self.streams:  # the last answer after a GOAWAY
                self.close()

    def on_reset(self, stream_id: int, error_code: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            if error_code == h2wire.REFUSED_STREAM:  # not processed: again
                self.client._again([stream.request])
            else:
                stream.request.finish(None, HttpConnectError(f"stream reset by the server (error {error_code})"))
                if not self.accepting and not self.streams:
                    self.close()

    def on_goaway(self, last_stream_id: int, error_code: int, unprocessed: list[int]) -> None:
        self.accepting = False
        self.client._draining(self)
        # never processed: sent again on a new connection, in the order they were sent
        again = [self.streams.pop(s).request for s in unprocessed if s in self.streams]
        if again:
            self.client._again(again)
        if not self.streams:
            self.close()

    def on_writable(self) -> None:
        pass  # the client pumps after every read

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(HttpConnectError("connection closed before the response"))

    def _lost(self, error: BaseException) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.request.finish(None, error)
        self.client._connection_lost(self)

    def close(self) -> None:
        if self.closed:
            return
        self.conn.close()
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class H2Client:
    """HTTP/2 requests to one origin over one connection, bound to the event loop that first uses it."""

    def __init__(
        self,
        origin: Origin,
        *,
        guard: Guard,
        ssl_context: ssl.SSLContext | None = None,
        resolver: Resolver | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        keep_headers: frozenset[bytes] | None = None,
        timeout_resolution: float = 0.025,
    ) -> None:
        """`keep_headers`: the response headers a Response carries (lower-case names; None: all). The
        others are stepped over undecoded, which is most of what reading an answer costs.

        Deadlines are kept by one sweep every `timeout_resolution` seconds while requests are live, as
        core.http.client keeps them, not by a timer per request."""
        if not origin.tls:
            raise ValueError("HTTP/2 is spoken over TLS (https) only here")
        self.origin = origin
        self.guard = guard
        self.ssl_context = ssl_context or h2_ssl_context()
        self.max_body_bytes = max_body_bytes
        self.keep_headers = keep_headers
        self._resolver = resolver
        self._authority = origin.host_header
        self._protocol: _H2Protocol | None = None
        self._opening: asyncio.Task | None = None
        self._waiting: deque[H2Request] = deque()
        self._old: set[_H2Protocol] = set()  # connections after a GOAWAY, answering their last streams
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: dict[H2Request, None] = {}  # requests not finished, in the order they started
        self._ordered = True  # their deadlines never decrease along `_live` (one timeout: the usual case)
        self._sweeper: asyncio.TimerHandle | None = None
        self.timeout_resolution = timeout_resolution
        self._pump_soon = False
        self.connections_opened = 0
        self.most_in_flight = 0  # the most streams in flight at once on the connection

    @property
    def in_flight(self) -> int:
        protocol = self._protocol
        return len(protocol.streams) if protocol is not None and not protocol.closed else 0

    def start(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes, timeout: float,
        on_done: OnResponse,
    ) -> H2Request:  # fmt: skip
        """Start a request now; `on_done(response, None)` or `on_done(None, error)` follows once, on the
        event loop (never from within this call) unless `cancel()` is called on the result first."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if self._closed:
            raise HttpConnectError("client closed")
        head = [
            (b":method", method.encode()), (b":scheme", b"https"), (b":authority", self._authority),
            (b":path", path.encode()), *headers,
        ]  # fmt: skip
        if body:
            head.append((b"content-length", str(len(body)).encode()))
        request = H2Request(self, head, body, loop.time() + timeout, on_done)
        live = self._live
        if not live:
            self._ordered = True
            if self._sweeper is None:
                self._sweeper = loop.call_later(self.timeout_resolution, self._sweep)
        elif self._ordered and request.deadline < next(reversed(live)).deadline:
            self._ordered = False
        live[request] = None
        self._waiting.append(request)
        if not self._pump_soon:  # one pump for all the requests started before the loop turns
            self._pump_soon = True
            loop.call_soon(self._pump_started)
        return request

    async def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      timeout: float) -> Response:  # fmt: skip
        future = asyncio.get_running_loop().create_future()

        def done(response: Response | None, error: BaseException | None) -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(response)

        request = self.start(method, path, headers, body, timeout, done)
        try:
            return await future
        except asyncio.CancelledError:
            request.cancel()
            raise

    def _pump_started(self) -> None:
        self._pump_soon = False
        self._pump()

    def _sweep(self) -> None:
        """Fail the live requests past their deadline; again in `timeout_resolution` while any are live."""
        now = self._loop.time()  # type: ignore[union-attr] - set by the first start()
        expired = []
        for request in self._live:
            if request.deadline <= now:
                expired.append(request)
            elif self._ordered:
                break
        for request in expired:
            self._expired(request)
        if self._live and not self._closed:
            self._sweeper = self._loop.call_later(self.timeout_resolution, self._sweep)  # type: ignore[union-attr]
        else:
            self._sweeper = None

    def _pump(self) -> None:
        """Start waiting requests on the connection while it has room; open it if there is none."""
        waiting = self._waiting
        while waiting and waiting[0].done:
            waiting.popleft()
        if not waiting or self._closed:
            return
        protocol = self._protocol
        if protocol is None or protocol.closed or not protocol.accepting:
            if protocol is not None and (protocol.closed or not protocol.accepting):
                self._protocol = None
            if self._opening is None:
                self._opening = asyncio.get_running_loop().create_task(self._open(waiting[0].deadline))
            return
        room = protocol.capacity()
        started = False
        while waiting and room > 0:
            request = waiting.popleft()
            if request.done:
                continue
            protocol.start(request)
            room -= 1
            started = True
            if not protocol.accepting:  # its stream ids ran out
                break
        if started:
            protocol.flush()
            self.most_in_flight = max(self.most_in_flight, len(protocol.streams))
        if waiting and not protocol.accepting:
            self._pump()  # the rest on a new connection

    async def _open(self, deadline: float) -> None:
        try:
            protocol = await self._connect(deadline)
        except Exception as exc:  # noqa: BLE001 - every waiting request learns why
            self._opening = None
            waiting, self._waiting = self._waiting, deque()
            for request in waiting:
                request.finish(None, exc)
            return
        self._opening = None
        if self._closed:
            protocol.close()
            return
        self._protocol = protocol
        self.connections_opened += 1
        self._pump()

    async def _resolve(self, host: str, port: int) -> list[tuple]:
        if self._resolver is not None:
            return await self._resolver(host, port)
        return await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )

    async def _connect(self, deadline: float) -> _H2Protocol:
        origin = self.origin
        transport, protocol = await open_connection(
            origin, deadline, self._resolve, self.guard, lambda: _H2Protocol(self), self.ssl_context
        )
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            transport.abort()
            raise HttpProtocolError(f"{origin.host} does not speak HTTP/2 (ALPN)")
        return protocol  # type: ignore[return-value] - made by the factory above

    def _expired(self, request: H2Request) -> None:
        if request.done:
            return
        protocol = self._holding(request)
        if protocol is not None:
            protocol.reset(request)
            self._pump()
        request.finish(None, HttpTimeout("no complete response before the timeout"))

    def _abandon(self, request: H2Request) -> None:
        protocol = self._holding(request)
        if protocol is not None:
            protocol.reset(request)
            self._pump()

    def _holding(self, request: H2Request) -> _H2Protocol | None:
        """The connection whose stream `request` is (the current one, or one answering after a GOAWAY)."""
        if request.stream_id:
            for protocol in (self._protocol, *self._old):
                if protocol is not None:
                    stream = protocol.streams.get(request.stream_id)
                    if stream is not None and stream.request is request:
                        return protocol
        return None

    def _draining(self, protocol: _H2Protocol) -> None:
        """`protocol` got a GOAWAY: new requests go to a new connection from now on."""
        if self._protocol is protocol:
            self._protocol = None
        self._old.add(protocol)

    def _again(self, requests: list[H2Request]) -> None:
        """Requests the server never processed: first in line for the next connection, as they were."""
        for request in reversed(requests):
            if not request.done:
                request.stream_id = 0
                self._waiting.appendleft(request)
        if not self._closed:
            asyncio.get_running_loop().call_soon(self._pump)

    def _connection_lost(self, protocol: _H2Protocol) -> None:
        self._old.discard(protocol)
        if self._protocol is protocol:
            self._protocol = None
        if self._waiting and not self._closed:
            asyncio.get_running_loop().call_soon(self._pump)

    async def aclose(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._opening is not None:
            self._opening.cancel()
        waiting, self._waiting = self._waiting, deque()
        for request in waiting:
            request.finish(None, HttpConnectError("client closed"))
        protocols = [p for p in (self._protocol, *self._old) if p is not None]
        self._protocol = None
        self._old.clear()
        for protocol in protocols:
            streams, protocol.streams = protocol.streams, {}
            protocol.close()
            for stream in streams.values():
                stream.request.finish(None, HttpConnectError("client closed"))
