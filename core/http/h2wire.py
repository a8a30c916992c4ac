"""The client side of HTTP/2's framing layer (RFC 9113), sans I/O, for one use: requests of a HEADERS
frame and a body on a long-lived connection, many streams at once, small answers.

`ClientConnection` turns requests into bytes (`send_request`, read with `data_to_send`) and bytes from
the server into calls on its `handler` (`receive`): `on_response(stream_id, status, headers)`,
`on_data(stream_id, data)`, `on_end(stream_id)`, `on_reset(stream_id, error_code)`,
`on_goaway(last_stream_id, error_code, unprocessed)` (the streams above the last-stream-id, which the
server never processed, in the order they were opened, dropped here) and `on_writable()` (a window
opened or the settings changed). A connection error raises `ConnectionError_` after queueing a GOAWAY that says why.
An exception from a handler's call leaves `receive` too, with the frames up to the one it came from
consumed: the next `receive` goes on after them, never reading one twice.

What it keeps of the protocol:
- the preface and SETTINGS (push disabled; our receive windows raised to `RECEIVE_WINDOW` for the
  connection and each stream), the server's SETTINGS applied and acknowledged, PING answered;
- request headers encoded by `Encoder` (HPACK from the static table and literals without indexing:
  nothing dynamic on the send side, no Huffman), split into CONTINUATION frames past the server's
  frame size; response headers decoded by `Decoder` with no dynamic table (our
  SETTINGS_HEADER_TABLE_SIZE is 0), only the headers the caller keeps read (Huffman by hpack's
  decoder), 1xx answers skipped, trailers read and dropped;
- flow control both ways: a body is sent as far as the connection's and its stream's windows and the
  frame size let it, the rest when WINDOW_UPDATE or SETTINGS open them; what the server sends is
  given back by WINDOW_UPDATE once half a window is used;
- RST_STREAM and GOAWAY passed on; after a GOAWAY the streams at or below its last-stream-id still
  take their answers (the caller opens no new stream here);
- frames of a stream this side closed (reset, timed out) are read and dropped; PRIORITY and unknown
  frame types are ignored; PUSH_PROMISE (push is off), a CONTINUATION out of place, a frame over the
  size we allow or a malformed one are connection errors (PROTOCOL_ERROR, FRAME_SIZE_ERROR,
  COMPRESSION_ERROR, FLOW_CONTROL_ERROR);
- a response header block is kept to `MAX_HEADER_BLOCK` bytes and `MAX_CONTINUATIONS` CONTINUATION
  frames: a server going past either (a hostile one could stream CONTINUATIONs without end) gets a
  connection error, ENHANCE_YOUR_CALM.

What it does not keep: priorities, server push, request trailers, the server's
SETTINGS_MAX_HEADER_LIST_SIZE (the callers' headers are a few hundred bytes).

Why not h2: for each APNs send h2 builds frame and event objects, runs two state machines, formats
`repr(frame)` for a debug log and scans its streams; this module is the part of that one client uses
(bench/push_send_bench.py measures the difference; the figures are in bench/results/).
Its conformance tests (tests/core/test_h2wire.py) run it against h2's server side and hypercorn.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from hpack.exceptions import HPACKError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_WINDOW = 65_535
RECEIVE_WINDOW = 1 << 20  # what the server may send us before we give it back
MAX_WINDOW = (1 << 31) - 1
MAX_STREAM_ID = (1 << 31) - 1
DEFAULT_FRAME_SIZE = 16_384
INITIAL_MAX_STREAMS = 100  # until the server's SETTINGS say (RFC 9113 leaves it unbounded)
MAX_HEADER_BLOCK = 64 * 1024  # the most of one response header block kept while its CONTINUATIONs come
MAX_CONTINUATIONS = 64  # the most CONTINUATION frames one header block may take

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5

_HEAD = struct.Struct(">HBBBL")  # length (24 bits as 16 + 8), type, flags, stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame (RFC 9113 §4.1)."""
    length = len(payload)
    return _HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


class ConnectionError_(Exception):  # noqa: N801 - not the builtin ConnectionError
    """The server broke the protocol; a GOAWAY with `code` is queued and the connection is unusable."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Handler(Protocol):
    def on_response(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...
    def on_data(self, stream_id: int, data: bytes) -> None: ...
    def on_end(self, stream_id: int) -> None: ...
    def on_reset(self, stream_id: int, error_code: int) -> None: ...
    def on_goaway(self, last_stream_id: int, error_code: int, unprocessed: list[int]) -> None: ...
    def on_writable(self) -> None: ...


# --- HPACK, send side ------------------------------------------------------------------------------


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


class Encoder:
    """HPACK without a dynamic table (RFC 7541): a field of the static table is its index, any other is
    a literal without indexing (never indexed for credentials) whose name is a static index where it
    has one, strings as they are (no Huffman). The peer's decoder keeps nothing of ours, so its
    table's size does not matter; the first block, and the first after the peer changes
    SETTINGS_HEADER_TABLE_SIZE, still open with a table size update to 0 (§4.2), which any limit allows."""

    def __init__(self) -> None:
        self.resize = True
        self._names: dict[bytes, bytes] = {}  # a name's representation up to its value (few names: kept)

    def encode(self, headers: Any) -> bytes:  # noqa: ANN401 - pairs of bytes
        parts = []
        if self.resize:
            parts.append(b"\x20")  # dynamic table size update: 0
            self.resize = False
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


class Decoder:
    """HPACK decoding with a dynamic table of size 0: the connection's SETTINGS_HEADER_TABLE_SIZE is 0,
    so the server's encoder keeps no table (RFC 7541 §4.2) and a block is its fields alone: static
    indexes and literals (an insertion into a table of size 0 leaves it empty, §4.4). A reference to
    the dynamic table, a size update above 0 or a malformed block is an HPACKError.

    `keep`: the names (lower case, `:status` always) whose fields are returned; the others are
    stepped over unread: their strings are not Huffman-decoded (hpack's `decode_huffman` for those
    that are). None keeps all."""

    def __init__(self, keep: frozenset[bytes] | None = None) -> None:
        self.keep = None if keep is None else frozenset({b":status", *keep})
        # a literal name's bytes as they may come: as they are, or Huffman-coded (the code is canonical)
        self._coded: dict[bytes, bytes] = {}
        for name in self.keep or ():
            self._coded[name] = name
            self._coded[_huffman(name)] = name

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        fields = []
        keep = self.keep
        static = HeaderTable.STATIC_TABLE
        size = len(block)
        pos = 0
        while pos < size:
            first = block[pos]
            if first & 0x80:  # indexed field (§6.1)
                index, pos = _read_int(block, pos, 0x7F)
                if not 1 <= index <= 61:
                    raise HPACKError(f"index {index}: not in the static table, and the dynamic one is empty")
                name, value = static[index - 1]
                if keep is None or name in keep:
                    fields.append((name, value))
                continue
            if first & 0xE0 == 0x20:  # dynamic table size update (§6.3): only to 0, only first
                new_size, pos = _read_int(block, pos, 0x1F)
                if new_size or fields:
                    raise HPACKError(f"a dynamic table size of {new_size} (allowed: 0, at a block's start)")
                continue
            # literal (§6.2): with incremental indexing 01, without 0000, never indexed 0001
            index, pos = _read_int(block, pos, 0x3F if first & 0x40 else 0x0F)
            if index:
                if index > 61:
                    raise HPACKError(f"name index {index}: not in the static table")
                name = static[index - 1][0]
                wanted = keep is None or name in keep
            else:
                coded, length, pos = _read_string(block, pos)
                if keep is None:
                    name = decode_huffman(block[pos - length : pos]) if coded else block[pos - length : pos]
                    wanted = True
                else:
                    name = self._coded.get(block[pos - length : pos], b"")
                    wanted = bool(name)
            coded, length, pos = _read_string(block, pos)
            if wanted:
                value = block[pos - length : pos]
                fields.append((name, decode_huffman(value) if coded else value))
        return fields


def _read_int(block: bytes, pos: int, mask: int) -> tuple[int, int]:
    """An HPACK integer (§5.1) at `pos` with a prefix of `mask`'s bits: (value, the position after it)."""
    value = block[pos] & mask
    pos += 1
    if value == mask:
        shift = 0
        while True:
            if pos >= len(block) or shift > 28:
                raise HPACKError("an integer runs past the block or past 2^32")
            byte = block[pos]
            pos += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
    return value, pos


def _read_string(block: bytes, pos: int) -> tuple[bool, int, int]:
    """A string literal (§5.2) at `pos`: (Huffman-coded, its length, the position after it)."""
    if pos >= len(block):
        raise HPACKError("a string literal past the block's end")
    coded = bool(block[pos] & 0x80)
    length, pos = _read_int(block, pos, 0x7F)
    if pos + length > len(block):
        raise HPACKError("a string literal runs past the block")
    return coded, length, pos + length


def _huffman(text: bytes) -> bytes:
    """`text` Huffman-coded (RFC 7541 Appendix B), as hpack's encoder codes it."""
    from hpack.huffman import HuffmanEncoder
    from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

    return HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH).encode(text)


# --- the connection --------------------------------------------------------------------------------


class _Stream:
    __slots__ = ("body", "ended", "received", "responded", "send_window", "sent")

    def __init__(self, body: bytes, send_window: int) -> None:
        self.body = body  # the request body not yet framed: body[sent:]
        self.sent = 0
        self.send_window = send_window
        self.received = 0  # flow-controlled bytes taken since the last WINDOW_UPDATE for the stream
        self.responded = False  # the final (non-1xx) headers came
        self.ended = False  # our END_STREAM is sent


class ClientConnection:
    def __init__(self, handler: Handler, keep_headers: frozenset[bytes] | None = None) -> None:
        """`keep_headers`: the response headers the handler is given (names in lower case); None: all."""
        self.handler = handler
        self.encoder = Encoder()
        self.decoder = Decoder(keep_headers)
        self.streams: dict[int, _Stream] = {}  # open streams (ours: odd ids)
        self.next_stream_id = 1
        self.max_streams = INITIAL_MAX_STREAMS  # the server's SETTINGS_MAX_CONCURRENT_STREAMS
        self.send_window = DEFAULT_WINDOW  # the connection's, for what we send
        self.stream_window = DEFAULT_WINDOW  # the server's SETTINGS_INITIAL_WINDOW_SIZE
        self.frame_size = DEFAULT_FRAME_SIZE  # the server's SETTINGS_MAX_FRAME_SIZE
        self.received = 0  # connection-level bytes taken since our last WINDOW_UPDATE
        self.goaway: int | None = None  # the last-stream-id of the server's GOAWAY
        self.closed = False
        self.blocked: list[int] = []  # streams whose body waits for a window
        self._out = bytearray()
        self._in = bytearray()
        # (stream, flags, block, CONTINUATION frames so far) of a header block awaiting its END_HEADERS
        self._continuing: tuple[int, int, bytearray, int] | None = None

    # sending

    def initiate(self) -> None:
        """The client preface, our SETTINGS (no dynamic HPACK table, no push, RECEIVE_WINDOW for each
        stream) and the connection window raised to RECEIVE_WINDOW."""
        settings = (
            _SETTING.pack(SETTINGS_HEADER_TABLE_SIZE, 0) + _SETTING.pack(SETTINGS_ENABLE_PUSH, 0)
            + _SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW)
        )  # fmt: skip
        self._out += PREFACE
        self._out += frame(SETTINGS, 0, 0, settings)
        self._out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(RECEIVE_WINDOW - DEFAULT_WINDOW))

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def capacity(self) -> int:
        """How many more streams may start now: 0 for good once the stream ids are used up (the caller
        lets the open streams finish and opens another connection)."""
        if self.closed or self.goaway is not None or self.next_stream_id > MAX_STREAM_ID:
            return 0
        return max(0, self.max_streams - len(self.streams))

    def send_request(self, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
        """Open a stream with `headers` (pseudo-headers first, names lower case) and `body`; its id."""
        stream_id = self.next_stream_id
        if stream_id > MAX_STREAM_ID:
            raise ValueError("the connection's stream ids are used up (capacity() is 0): open another")
        self.next_stream_id += 2
        block = self.encoder.encode(headers)
        stream = _Stream(body, self.stream_window)
        self.streams[stream_id] = stream
        out = self._out
        size = len(body)
        limit = self.frame_size
        if len(block) <= limit:
            if not size:
                stream.ended = True
                out += _HEAD.pack(len(block) >> 8, len(block) & 0xFF, HEADERS, END_HEADERS | END_STREAM, stream_id)
                out += block
                return stream_id
            out += _HEAD.pack(len(block) >> 8, len(block) & 0xFF, HEADERS, END_HEADERS, stream_id)
            out += block
            if size <= limit and size <= self.send_window and size <= stream.send_window:  # the usual case
                out += _HEAD.pack(size >> 8, size & 0xFF, DATA, END_STREAM, stream_id)
                out += body
                self.send_window -= size
                stream.send_window -= size
                stream.sent = size
                stream.ended = True
                return stream_id
        else:
            chunks = [block[i : i + limit] for i in range(0, len(block), limit)]
            out += frame(HEADERS, 0 if size else END_STREAM, stream_id, chunks[0])
            for i, chunk in enumerate(chunks[1:], start=2):
                out += frame(CONTINUATION, END_HEADERS if i == len(chunks) else 0, stream_id, chunk)
            if not size:
                stream.ended = True
                return stream_id
        if not self._send_body(stream_id, stream):
            self.blocked.append(stream_id)
        return stream_id

    def _send_body(self, stream_id: int, stream: _Stream) -> bool:
        """Frame what the windows allow of the stream's body; True once all of it is sent."""
        body = stream.body
        while stream.sent < len(body):
            room = min(self.send_window, stream.send_window, self.frame_size, len(body) - stream.sent)
            if room <= 0:
                return False
            chunk = body[stream.sent : stream.sent + room]
            stream.sent += room
            self.send_window -= room
            stream.send_window -= room
            last = stream.sent == len(body)
            self._out += frame(DATA, END_STREAM if last else 0, stream_id, chunk)
        stream.ended = True
        return True

    def _unblock(self) -> None:
        blocked, self.blocked = self.blocked, []
        for stream_id in blocked:
            stream = self.streams.get(stream_id)
            if stream is not None and not stream.ended and not self._send_body(stream_id, stream):
                self.blocked.append(stream_id)

    def reset(self, stream_id: int, code: int = CANCEL) -> None:
        """Give stream `stream_id` up (RST_STREAM); what comes for it later is dropped."""
        if self.streams.pop(stream_id, None) is not None and not self.closed:
            self._out += frame(RST_STREAM, 0, stream_id, _U32.pack(code))

    def ping(self, payload: bytes = b"\0" * 8) -> None:
        self._out += frame(PING, 0, 0, payload)

    def close(self, code: int = NO_ERROR) -> None:
        """GOAWAY (we take no stream from the server: last-stream-id 0); nothing more is sent."""
        if not self.closed:
            self._out += frame(GOAWAY, 0, 0, _U32.pack(0) + _U32.pack(code))
            self.closed = True

    # receiving

    def receive(self, data: bytes) -> None:
        """Take bytes from the server; the handler hears what they complete, in order."""
        if self.closed:
            return
        buffer = self._in
        buffer += data
        start = 0
        end = len(buffer)
        try:
            while end - start >= 9:
                high, low, kind, flags, stream_id = _HEAD.unpack_from(buffer, start)
                length = (high << 8) | low
                if length > DEFAULT_FRAME_SIZE:  # we never raise SETTINGS_MAX_FRAME_SIZE
                    raise ConnectionError_(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - start < 9 + length:
                    break
                payload = bytes(buffer[start + 9 : start + 9 + length])
                start += 9 + length
                self._frame(kind, flags, stream_id & MAX_STREAM_ID, payload)
                if self.closed:
                    break
        except ConnectionError_ as exc:
            self.close(exc.code)
            start = len(buffer)
            raise
        finally:  # what was read is dropped even when a handler raised: it is never read twice
            del buffer[:start]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "a header block interrupted")
        if kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise ConnectionError_(PROTOCOL_ERROR if stream_id == 0 else FRAME_SIZE_ERROR, "bad RST_STREAM")
            if self.streams.pop(stream_id, None) is not None:
                self.handler.on_reset(stream_id, _U32.unpack(payload)[0])
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise ConnectionError_(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "bad PING")
            if not flags & ACK:
                self._out += frame(PING, ACK, 0, payload)
        elif kind == GOAWAY:
            if stream_id or len(payload) < 8:
                raise ConnectionError_(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "bad GOAWAY")
            last, code = _U32.unpack_from(payload)[0] & MAX_STREAM_ID, _U32.unpack_from(payload, 4)[0]
            self.goaway = last if self.goaway is None else min(self.goaway, last)
            unprocessed = sorted(s for s in self.streams if s > last)  # never processed (§6.8)
            for unseen in unprocessed:
                del self.streams[unseen]
            self.handler.on_goaway(last, code, unprocessed)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE with push disabled")
        elif kind == PRIORITY:
            if stream_id == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
        # unknown types are ignored (RFC 9113 §4.1)

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1 : len(payload) - payload[0]]
        return payload

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ConnectionError_(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        if not flags & END_HEADERS:
            self._continuing = (stream_id, flags, bytearray(block), 0)
            return
        self._block(stream_id, flags, block)

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        continuing = self._continuing
        if continuing is None or continuing[0] != stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION out of place")
        stream_id, first_flags, block, count = continuing
        block.extend(payload)
        count += 1
        if len(block) > MAX_HEADER_BLOCK or count > MAX_CONTINUATIONS:
            # a server streaming a header block without end would otherwise grow it without limit
            raise ConnectionError_(
                ENHANCE_YOUR_CALM, f"a header block past {MAX_HEADER_BLOCK} bytes or {MAX_CONTINUATIONS} CONTINUATIONs"
            )
        if flags & END_HEADERS:
            self._continuing = None
            self._block(stream_id, first_flags, bytes(block))
        else:
            self._continuing = (stream_id, first_flags, block, count)

    def _block(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            headers = self.decoder.decode(block)
        except HPACKError as exc:
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {exc}") from None
        stream = self._stream(stream_id, "HEADERS")
        if stream is None:
            return
        if not stream.responded:
            status = 0
            if headers and headers[0][0] == b":status":
                try:
                    status = int(headers[0][1])
                except ValueError:
                    status = 0
            if not 100 <= status <= 999:
                self.reset(stream_id, PROTOCOL_ERROR)
                self.handler.on_reset(stream_id, PROTOCOL_ERROR)
                return
            if status < 200:
                if flags & END_STREAM:
                    raise ConnectionError_(PROTOCOL_ERROR, "a 1xx answer ended its stream")
                return  # informational: the answer follows
            stream.responded = True
            self.handler.on_response(stream_id, status, headers[1:])
        elif not flags & END_STREAM:
            raise ConnectionError_(PROTOCOL_ERROR, "trailers without END_STREAM")
        if flags & END_STREAM:
            self._ended(stream_id, stream)

    def _stream(self, stream_id: int, kind: str) -> _Stream | None:
        """The open stream a frame of `kind` is for; None for one this side closed (the frame is
        dropped); a connection error for one never opened."""
        stream = self.streams.get(stream_id)
        if stream is None and (stream_id >= self.next_stream_id or not stream_id & 1):
            raise ConnectionError_(PROTOCOL_ERROR, f"{kind} on stream {stream_id}, never opened")
        return stream

    def _ended(self, stream_id: int, stream: _Stream) -> None:
        del self.streams[stream_id]
        if not stream.ended:  # the server answered before the whole body: we stop sending it
            self._out += frame(RST_STREAM, 0, stream_id, _U32.pack(NO_ERROR))
        self.handler.on_end(stream_id)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)  # padding included: it counts against the windows (§6.1)
        self.received += size
        if self.received > RECEIVE_WINDOW:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "the server sent past the connection's window")
        if self.received >= RECEIVE_WINDOW // 2:
            self._out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.received))
            self.received = 0
        data = self._unpad(flags, payload)
        stream = self._stream(stream_id, "DATA")
        if stream is None:
            return
        if not stream.responded:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA before the response's headers")
        stream.received += size
        if stream.received > RECEIVE_WINDOW:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "the server sent past a stream's window")
        if data:
            self.handler.on_data(stream_id, data)
        if flags & END_STREAM:
            if stream_id in self.streams:  # the handler may have reset it
                self._ended(stream_id, stream)
        elif stream.received >= RECEIVE_WINDOW // 2 and stream_id in self.streams:
            self._out += frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.received))
            stream.received = 0

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        for offset in range(0, len(payload), 6):
            name, value = _SETTING.unpack_from(payload, offset)
            if name == SETTINGS_HEADER_TABLE_SIZE:
                self.encoder.resize = True
            elif name == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.max_streams = value
            elif name == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                delta = value - self.stream_window
                self.stream_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ConnectionError_(FLOW_CONTROL_ERROR, "a stream's window over 2^31-1")
            elif name == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.frame_size = value
            elif name == SETTINGS_ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
        self._out += frame(SETTINGS, ACK, 0)
        self._unblock()
        self.handler.on_writable()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes")
        increment = _U32.unpack(payload)[0] & MAX_WINDOW
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "the connection's window over 2^31-1")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return  # closed, or never ours: nothing to send on it
            if increment == 0 or stream.send_window + increment > MAX_WINDOW:
                self.reset(stream_id, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
                self.handler.on_reset(stream_id, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
                return
            stream.send_window += increment
        if self.blocked:
            self._unblock()
            self.handler.on_writable()
