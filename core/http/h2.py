"""One multiplexed HTTP/2 connection over TLS to one origin (the APNs provider's transport), on `h2`.

Why not httpx[http2]: its connection pool opens connections through its own network backend, so the
SSRF guard could not see the resolved addresses (this client resolves, lets the guard check every
candidate, and connects to a checked address, as core.http.client does), and every request would
cost a task and several coroutines. Here a request is a stream started at once: `start()` calls
back once with the response or the error, on the event loop.

- one TLS connection (ALPN `h2`), opened on first use and again after it closes or the server
  sends GOAWAY; requests wait (FIFO) while it opens or while the server's
  SETTINGS_MAX_CONCURRENT_STREAMS are all in flight;
- one deadline per request (waiting, connecting, sending, the response), kept by a timer;
- request bodies respect flow control (sent as the windows open); response bodies are acknowledged
  as they arrive and capped at `max_body_bytes`;
- GOAWAY: the streams above its last-stream-id were never processed (RFC 9113 §6.8), so they start
  again on a new connection, as does a stream the server resets with REFUSED_STREAM; the streams at
  or below it are still answered on the old connection, which closes once they are (h2 refuses every
  frame after a GOAWAY: `_Connection` lets the answers in). A stream reset otherwise, or in flight on
  a connection lost without a GOAWAY covering it, fails with HttpConnectError (transient: it may
  have been processed); a timed-out stream is reset (CANCEL) and fails with HttpTimeout;
- request headers are encoded by `_Encoder` (stateless HPACK, no Huffman) and not validated again
  by h2: the callers build them (lower-case names, values checked where they come from), and hpack's
  own encoder (Huffman and its dynamic table in pure Python) was a quarter of an APNs send's CPU.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections import deque
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
from hpack.table import HeaderTable

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
    __slots__ = ("body", "client", "deadline", "done", "headers", "on_done", "sent", "stream_id", "timer")

    def __init__(self, client: H2Client, headers: list[tuple[bytes, bytes]], body: bytes, deadline: float,
                 on_done: OnResponse) -> None:  # fmt: skip
        self.client = client
        self.headers = headers
        self.body = body
        self.sent = 0  # bytes of the body on the wire
        self.deadline = deadline
        self.on_done = on_done
        self.done = False
        self.stream_id = 0
        self.timer: asyncio.TimerHandle | None = None

    def finish(self, response: Response | None, error: BaseException | None) -> None:
        if self.done:
            return
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
        self.on_done(response, error)

    def cancel(self) -> None:
        """Give the request up: its stream is reset; no callback follows."""
        if self.done:
            return
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
        self.client._abandon(self)


class _Stream:
    __slots__ = ("body", "headers", "request", "status", "truncated")

    def __init__(self, request: H2Request) -> None:
        self.request = request
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.truncated = False


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) in a `prefix_bits` prefix, `first` the first byte's high bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_STATIC_FIELDS: dict[tuple[bytes, bytes], int] = {}
_STATIC_NAMES: dict[bytes, int] = {}
for _index, (_name, _value) in enumerate(HeaderTable.STATIC_TABLE, start=1):
    _STATIC_FIELDS.setdefault((_name, _value), _index)
    _STATIC_NAMES.setdefault(_name, _index)
_NEVER_INDEXED = frozenset({b"authorization", b"proxy-authorization", b"cookie", b"set-cookie"})


class _Encoder:
    """HPACK without a dynamic table (RFC 7541): a field of the static table is its index, any other is
    a literal without indexing (never indexed for credentials) whose name is a static index where it
    has one, strings as they are (no Huffman). What a block costs is a few byte joins; the decoder
    keeps no state of ours. The first block (and the first after the peer changes its table size)
    starts with a table size update to 0, which any limit allows. h2's stand-in for hpack's Encoder
    (`H2Connection.encoder`): `encode(headers)` and `header_table_size`."""

    def __init__(self) -> None:
        self._resize = True
        self._names: dict[bytes, bytes] = {}  # a name's representation up to its value (few names: kept)

    @property
    def header_table_size(self) -> int:
        return 0

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:  # the peer's SETTINGS_HEADER_TABLE_SIZE
        self._resize = True

    def encode(self, headers: Any, huffman: bool = True) -> bytes:  # noqa: ANN401, ARG002, FBT001, FBT002
        parts = []
        if self._resize:
            parts.append(b"\x20")  # dynamic table size update: 0
            self._resize = False
        names = self._names
        for name, value in headers:
            index = _STATIC_FIELDS.get((name, value))
            if index is not None:
                parts.append(bytes((0x80 | index,)))
                continue
            head = names.get(name)
            if head is None:
                head = self._name(name)
            parts.append(head)
            parts.append(_integer(len(value), 7, 0))
            parts.append(value)
        return b"".join(parts)

    def _name(self, name: bytes) -> bytes:
        first = 0x10 if name in _NEVER_INDEXED else 0x00
        index = _STATIC_NAMES.get(name)
        head = _integer(index, 4, first) if index is not None else bytes((first,)) + _integer(len(name), 7, 0) + name
        if len(self._names) < 64:
            self._names[name] = head
        return head


def _frame_head(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    """An HTTP/2 frame header (RFC 9113 §4.1)."""
    return _HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


_HEAD = struct.Struct(">HBBBL")


class _Connection(h2.connection.H2Connection):
    """h2's connection, which after a GOAWAY from the server still takes the frames of the streams
    the server said it processes (h2 would close at once and refuse them as a protocol error). No new
    stream is opened on it after that (`_H2Protocol.accepting`)."""

    def _receive_goaway_frame(self, frame: Any) -> tuple[list, list]:  # noqa: ANN401
        frames, events = super()._receive_goaway_frame(frame)
        self.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        return frames, events

    # h2 counts the open streams by scanning every stream it holds (and drops the closed ones while it
    # is at it) whenever a stream starts: with 100 in flight, a tenth of an APNs send. Here a stream
    # is dropped as soon as it closes (`forget`), so what is held is what is open; a full scan still
    # runs every 256th count, for a stream that closed some other way.
    _counted = 0

    def _open_streams(self, remainder: int) -> int:
        self._counted += 1
        if remainder != 1 or not self._counted & 255:
            return super()._open_streams(remainder)
        return len(self.streams)

    def send_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Open stream `stream_id` with a request's HEADERS and its body in one DATA frame, framed here
        (h2 builds frame objects, flags sets and priority fields for each and serialises them: a
        fifth of an APNs send), through h2's own state machines and flow-control windows as
        `send_headers` and `send_data` would. False, with nothing done, when the request needs more
        than one frame of each or a window is too small for the body: h2 sends it then."""
        block = self.encoder.encode(headers)
        size = len(body)
        limit = self.max_outbound_frame_size
        if (
            len(block) > limit or size > limit or size > self.outbound_flow_control_window
            or size > self.remote_settings.initial_window_size
        ):  # fmt: skip
            return False
        self.state_machine.process_input(h2.connection.ConnectionInputs.SEND_HEADERS)
        stream = self._begin_new_stream(stream_id, h2.connection.AllowedStreamIDs.ODD)
        machine = stream.state_machine
        machine.process_input(h2.stream.StreamInputs.SEND_HEADERS)
        stream.request_method = headers[0][1]  # :method (a HEAD's answer has no body)
        out = self._data_to_send
        if not size:
            machine.process_input(h2.stream.StreamInputs.SEND_END_STREAM)
            out += _frame_head(len(block), 0x1, 0x5, stream_id)  # HEADERS, END_HEADERS | END_STREAM
            out += block
            return True
        out += _frame_head(len(block), 0x1, 0x4, stream_id)  # HEADERS, END_HEADERS
        out += block
        self.state_machine.process_input(h2.connection.ConnectionInputs.SEND_DATA)
        machine.process_input(h2.stream.StreamInputs.SEND_DATA)
        machine.process_input(h2.stream.StreamInputs.SEND_END_STREAM)
        out += _frame_head(size, 0x0, 0x1, stream_id)  # DATA, END_STREAM
        out += body
        stream.outbound_flow_control_window -= size
        self.outbound_flow_control_window -= size
        return True

    def forget(self, stream_id: int) -> None:
        """Drop stream `stream_id` once it is closed, as h2's scan would."""
        stream = self.streams.get(stream_id)
        if stream is not None and stream.closed:
            del self.streams[stream_id]
            self._closed_streams[stream_id] = stream.closed_by


class _H2Protocol(asyncio.Protocol):
    def __init__(self, client: H2Client) -> None:
        self.client = client
        # headers as the callers build them (bytes, lower-case names): not normalised or validated again
        # and the server's not validated either: a response is read for its status, retry-after and body
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False, validate_inbound_headers=False,
        )  # fmt: skip
        self.conn = _Connection(config)
        self.conn.encoder = _Encoder()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.blocked: deque[int] = deque()  # streams whose body waits for a window
        self.closed = False
        self.accepting = True  # false after GOAWAY: no new streams here

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.conn.initiate_connection()
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def capacity(self) -> int:
        if self.closed or not self.accepting:
            return 0
        limit = self.conn.remote_settings.max_concurrent_streams
        return max(0, limit - len(self.streams))

    def start(self, request: H2Request) -> None:
        stream_id = self.conn.get_next_available_stream_id()
        request.stream_id = stream_id
        if self.conn.send_request(stream_id, request.headers, request.body):
            request.sent = len(request.body)
            self.streams[stream_id] = _Stream(request)
            return
        self.conn.send_headers(stream_id, request.headers, end_stream=not request.body)
        self.streams[stream_id] = _Stream(request)
        if request.body:
            self._send_body(stream_id, request)
        # written by the caller's flush (one write for every stream a pump starts)

    def _send_body(self, stream_id: int, request: H2Request) -> None:
        body = request.body
        while request.sent < len(body):
            window = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size)
            if window <= 0:
                self.blocked.append(stream_id)
                return
            chunk = body[request.sent : request.sent + window]
            request.sent += len(chunk)
            self.conn.send_data(stream_id, chunk, end_stream=request.sent == len(body))

    def reset(self, request: H2Request) -> None:
        self.streams.pop(request.stream_id, None)
        if self.closed:
            return
        try:
            self.conn.reset_stream(request.stream_id, h2.errors.ErrorCodes.CANCEL)
        except h2.exceptions.H2Error:
            pass  # already closed on our side
        self.conn.forget(request.stream_id)
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.H2Error as exc:
            self._lost(HttpProtocolError(f"HTTP/2 protocol error: {exc}"))
            return
        for event in events:
            if isinstance(event, h2.events.ResponseReceived):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    for name, value in event.headers:
                        key = name.decode("latin-1")
                        if key == ":status":
                            stream.status = int(value)
                        else:
                            stream.headers[key] = value.decode("latin-1")
            elif isinstance(event, h2.events.DataReceived):
                if event.flow_controlled_length:
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    room = self.client.max_body_bytes - len(stream.body)
                    stream.body += event.data[: max(0, room)]
                    stream.truncated = stream.truncated or len(event.data) > room
            elif isinstance(event, h2.events.StreamEnded):
                self.conn.forget(event.stream_id)
                stream = self.streams.pop(event.stream_id, None)
                if stream is not None:
                    response = Response(stream.status, "", stream.headers, bytes(stream.body), stream.truncated)
                    stream.request.finish(response, None)
                    if not self.accepting and not self.streams:  # the last answer after a GOAWAY
                        self.close()
            elif isinstance(event, h2.events.StreamReset):
                self.conn.forget(event.stream_id)
                stream = self.streams.pop(event.stream_id, None)
                if stream is not None:
                    if event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM:  # not processed: again
                        self.client._again([stream.request])
                    else:
                        error = HttpConnectError(f"stream reset by the server ({event.error_code!r})")
                        stream.request.finish(None, error)
            elif isinstance(event, h2.events.WindowUpdated):
                self._unblock()
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
                    self._unblock()
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.accepting = False
                self.client._draining(self)
                last = event.last_stream_id or 0
                # never processed: sent again on a new connection, in the order they were sent
                again = [self.streams.pop(s).request for s in sorted(s for s in self.streams if s > last)]
                if again:
                    self.client._again(again)
                if not self.streams:
                    self.close()
        self.flush()
        self.client._pump()

    def _unblock(self) -> None:
        blocked, self.blocked = self.blocked, deque()
        for stream_id in blocked:
            stream = self.streams.get(stream_id)
            if stream is not None:
                self._send_body(stream_id, stream.request)

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
        try:
            self.conn.close_connection()
            self.flush()
        except h2.exceptions.H2Error:
            pass
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
    ) -> None:
        if not origin.tls:
            raise ValueError("HTTP/2 is spoken over TLS (https) only here")
        self.origin = origin
        self.guard = guard
        self.ssl_context = ssl_context or h2_ssl_context()
        self.max_body_bytes = max_body_bytes
        self._resolver = resolver
        self._authority = origin.host_header
        self._protocol: _H2Protocol | None = None
        self._opening: asyncio.Task | None = None
        self._waiting: deque[H2Request] = deque()
        self._old: set[_H2Protocol] = set()  # connections after a GOAWAY, answering their last streams
        self._closed = False
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
        loop = asyncio.get_running_loop()
        if self._closed:
            raise HttpConnectError("client closed")
        head = [
            (b":method", method.encode()), (b":scheme", b"https"), (b":authority", self._authority),
            (b":path", path.encode()), *headers,
        ]  # fmt: skip
        if body:
            head.append((b"content-length", str(len(body)).encode()))
        request = H2Request(self, head, body, loop.time() + timeout, on_done)
        request.timer = loop.call_at(request.deadline, self._expired, request)
        self._waiting.append(request)
        loop.call_soon(self._pump)
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
            try:
                protocol.start(request)
            except h2.exceptions.H2Error as exc:
                request.finish(None, HttpProtocolError(f"HTTP/2: {exc}"))
                continue
            room -= 1
            started = True
        if started:
            protocol.flush()
            self.most_in_flight = max(self.most_in_flight, len(protocol.streams))

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
        request.timer = None
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
                request.sent = 0
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
