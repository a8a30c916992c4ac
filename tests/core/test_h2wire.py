"""core.http.h2wire against h2's server side as the peer (both sans I/O, bytes passed by hand): requests
and answers, frames split at every byte boundary, flow control both ways, SETTINGS changes, PING,
RST_STREAM, GOAWAY, 1xx answers, trailers, CONTINUATION, and the server's protocol errors. Over TLS
and against hypercorn: tests/push (the APNs stand-ins) through core.http.h2."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hpack import Encoder as HpackEncoder
from hpack.exceptions import HPACKError

from core.http import h2wire


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_response(self, stream_id, status, headers):
        self.events.append(("response", stream_id, status, list(headers)))

    def on_data(self, stream_id, data):
        if self.events and self.events[-1][:2] == ("data", stream_id):
            self.events[-1] = ("data", stream_id, self.events[-1][2] + data)
        else:
            self.events.append(("data", stream_id, data))

    def on_end(self, stream_id):
        self.events.append(("end", stream_id))

    def on_reset(self, stream_id, code):
        self.events.append(("reset", stream_id, code))

    def on_goaway(self, last, code, unprocessed):
        self.events.append(("goaway", last, code, unprocessed))

    def on_writable(self):
        pass


class Pair:
    """Our client and h2's server; `to_server()`/`to_client()` move what each has written."""

    def __init__(self, keep=None, server_settings=None):
        self.recorder = Recorder()
        self.client = h2wire.ClientConnection(self.recorder, keep)
        self.server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.server.initiate_connection()
        if server_settings:
            self.server.update_settings(server_settings)
        self.client.initiate()
        self.server_events: list = []
        self.to_server()
        self.to_client()
        self.to_server()

    def to_server(self) -> list:
        events = self.server.receive_data(self.client.data_to_send())
        self.server_events += events
        return events

    def to_client(self, split: int = 0) -> None:
        data = self.server.data_to_send()
        if split:
            for i in range(0, len(data), split):
                self.client.receive(data[i : i + split])
        else:
            self.client.receive(data)

    def request(self, body=b"", extra=()):
        headers = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"example.com"),
                   (b":path", b"/3/device/abc"), (b"authorization", b"bearer x"), *extra]  # fmt: skip
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        return self.client.send_request(headers, body)

    def answer(self, stream_id, status=200, headers=(), body=b""):
        self.server.send_headers(stream_id, [(b":status", str(status).encode()), *headers], end_stream=not body)
        if body:
            self.server.send_data(stream_id, body, end_stream=True)


def received(events, kind):
    return [e for e in events if isinstance(e, kind)]


def test_a_request_and_its_answer_with_every_header_when_none_are_chosen():
    pair = Pair()
    stream_id = pair.request(b'{"aps":{}}', [(b"apns-topic", b"com.example.app")])
    events = pair.to_server()
    (request,) = received(events, h2.events.RequestReceived)
    assert dict(request.headers)[b":path"] == b"/3/device/abc"
    assert dict(request.headers)[b"apns-topic"] == b"com.example.app"
    assert received(events, h2.events.DataReceived)[0].data == b'{"aps":{}}'
    assert received(events, h2.events.StreamEnded)
    headers = [(b"apns-id", b"0e7c0c4a-8f5b-4a86-a1a5-2f6b1b6e1a11"), (b"retry-after", b"30"), (b"server", b"h2")]
    pair.answer(stream_id, 429, headers, b'{"reason":"TooManyRequests"}')
    pair.to_client()
    assert pair.recorder.events == [
        ("response", stream_id, 429, headers),
        ("data", stream_id, b'{"reason":"TooManyRequests"}'),
        ("end", stream_id),
    ]
    assert not pair.client.streams


def test_only_the_kept_headers_are_given_and_the_others_are_not_decoded():
    pair = Pair(keep=frozenset({b"retry-after", b"x-custom"}))
    stream_ids = [pair.request(b"{}") for _ in range(3)]
    pair.to_server()
    for stream_id in stream_ids:  # h2 Huffman-codes these names and values
        pair.answer(stream_id, 503, [(b"apns-id", b"abc"), (b"x-custom", b"v"), (b"retry-after", b"7")])
    pair.to_client()
    responses = [e for e in pair.recorder.events if e[0] == "response"]
    assert responses == [("response", s, 503, [(b"x-custom", b"v"), (b"retry-after", b"7")]) for s in stream_ids]


@pytest.mark.parametrize("split", [1, 2, 3, 5, 8, 9, 10, 17])
def test_the_server_s_bytes_split_at_every_boundary_read_the_same(split):
    whole, pieces = Pair(), Pair()
    for pair in (whole, pieces):
        streams = [pair.request(b"x" * 50) for _ in range(3)]
        pair.to_server()
        pair.server.ping(b"12345678")
        for i, stream_id in enumerate(streams):
            pair.answer(stream_id, 200 + i, [(b"apns-id", b"%d" % i)], b"body-%d" % i)
        pair.server.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 7})
    whole.to_client()
    pieces.to_client(split)
    assert pieces.recorder.events == whole.recorder.events
    assert len(whole.recorder.events) == 9 and pieces.client.max_streams == 7
    assert received(pieces.to_server(), h2.events.PingAckReceived)[0].ping_data == b"12345678"


def test_a_body_larger_than_the_windows_goes_as_they_open():
    pair = Pair()
    body = bytes(range(256)) * 1000  # 256,000 bytes: past the 65,535 windows
    stream_id = pair.request(body)
    got = bytearray()
    for _ in range(50):
        events = pair.to_server()
        for event in received(events, h2.events.DataReceived):
            got += event.data
            pair.server.acknowledge_received_data(event.flow_controlled_length, stream_id)
        if received(events, h2.events.StreamEnded):
            break
        pair.to_client()
    assert bytes(got) == body
    assert pair.client.streams[stream_id].ended


def test_a_smaller_initial_window_then_a_larger_one_holds_then_releases_a_body():
    pair = Pair(server_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10})
    stream_id = pair.request(b"y" * 100)
    events = pair.to_server()
    assert sum(len(e.data) for e in received(events, h2.events.DataReceived)) == 10
    assert stream_id in pair.client.blocked
    pair.server.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    pair.to_client()
    events = pair.to_server()
    assert sum(len(e.data) for e in received(events, h2.events.DataReceived)) == 90
    assert received(events, h2.events.StreamEnded)


def test_long_answers_are_given_back_their_window():
    pair = Pair()
    stream_id = pair.request()
    pair.to_server()
    body = b"z" * (3 * h2wire.RECEIVE_WINDOW)  # h2 stops at the windows unless we give them back
    pair.server.send_headers(stream_id, [(b":status", b"200")])
    sent = 0
    for _ in range(1000):
        room = min(pair.server.local_flow_control_window(stream_id), pair.server.max_outbound_frame_size)
        chunk = body[sent : sent + room]
        sent += len(chunk)
        pair.server.send_data(stream_id, chunk, end_stream=sent == len(body))
        pair.to_client()
        pair.to_server()
        if sent == len(body):
            break
    assert pair.recorder.events[-1] == ("end", stream_id)
    assert pair.recorder.events[1] == ("data", stream_id, body)


def test_a_server_reset_and_a_goaway_name_their_streams():
    pair = Pair()
    streams = [pair.request(b"{}") for _ in range(4)]
    pair.to_server()
    pair.server.reset_stream(streams[0], h2.errors.ErrorCodes.REFUSED_STREAM)
    pair.server.close_connection(last_stream_id=streams[1])
    pair.to_client()
    assert pair.recorder.events == [
        ("reset", streams[0], h2wire.REFUSED_STREAM),
        ("goaway", streams[1], 0, streams[2:]),
    ]
    assert pair.client.capacity() == 0 and list(pair.client.streams) == [streams[1]]


def test_after_a_goaway_the_streams_it_covers_are_still_answered():
    pair = Pair()
    streams = [pair.request() for _ in range(2)]
    pair.to_server()
    frames = pair.server.data_to_send()  # nothing yet
    pair.client.receive(frames + h2wire.frame(h2wire.GOAWAY, 0, 0, b"\0\0\0\3\0\0\0\0"))
    pair.answer(streams[0])
    pair.server.send_headers(streams[1], [(b":status", b"200")], end_stream=True)
    pair.to_client()
    assert [e[0] for e in pair.recorder.events] == ["goaway", "response", "end", "response", "end"]


def test_informational_answers_are_skipped_and_trailers_dropped():
    pair = Pair()
    stream_id = pair.request()
    pair.to_server()
    pair.server.send_headers(stream_id, [(b":status", b"103"), (b"link", b"</a>")])
    pair.server.send_headers(stream_id, [(b":status", b"200")])
    pair.server.send_data(stream_id, b"ok")
    pair.server.send_headers(stream_id, [(b"grpc-status", b"0")], end_stream=True)
    pair.to_client()
    assert pair.recorder.events == [("response", stream_id, 200, []), ("data", stream_id, b"ok"), ("end", stream_id)]


def test_header_blocks_past_a_frame_go_in_continuation_frames_both_ways():
    pair = Pair()
    big = b"v" * 40_000
    stream_id = pair.request(b"{}", [(b"x-big", big)])
    (request,) = received(pair.to_server(), h2.events.RequestReceived)
    assert dict(request.headers)[b"x-big"] == big
    pair.answer(stream_id, 200, [(b"x-big", big)])
    pair.to_client(split=1000)
    assert pair.recorder.events == [("response", stream_id, 200, [(b"x-big", big)]), ("end", stream_id)]


def test_a_larger_frame_size_and_a_new_table_size_are_used():
    pair = Pair()
    pair.server.update_settings({h2.settings.SettingCodes.MAX_FRAME_SIZE: 32_768,
                                 h2.settings.SettingCodes.HEADER_TABLE_SIZE: 100})  # fmt: skip
    pair.to_client()
    pair.to_server()  # our ACK (h2 takes larger frames once it has it)
    assert pair.client.frame_size == 32_768 and pair.client.encoder.resize
    pair.request(b"b" * 30_000)
    events = pair.to_server()
    assert [len(e.data) for e in received(events, h2.events.DataReceived)] == [30_000]


def test_a_closed_stream_s_late_frames_are_dropped():
    pair = Pair()
    stream_id = pair.request()
    pair.to_server()
    pair.client.reset(stream_id)  # timed out here
    assert received(pair.to_server(), h2.events.StreamReset)
    pair.client.receive(h2wire.frame(h2wire.HEADERS, h2wire.END_HEADERS, stream_id, b"\x88"))
    pair.client.receive(h2wire.frame(h2wire.DATA, h2wire.END_STREAM, stream_id, b"late"))
    assert pair.recorder.events == []


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (h2wire.frame(h2wire.PUSH_PROMISE, 0x4, 1, b"\0\0\0\2\x88"), h2wire.PROTOCOL_ERROR),
        (h2wire.frame(h2wire.PING, 0, 0, b"short"), h2wire.FRAME_SIZE_ERROR),
        (b"\x00\x40\x01\x00\x00\x00\x00\x00\x01", h2wire.FRAME_SIZE_ERROR),  # 16,385 bytes announced
        (h2wire.frame(h2wire.HEADERS, 0x5, 1, b"\xbe"), h2wire.COMPRESSION_ERROR),  # dynamic index 62
        (h2wire.frame(h2wire.HEADERS, 0x5, 1, b"\x3f\xe1\x1f"), h2wire.COMPRESSION_ERROR),  # table size 4096
        (h2wire.frame(h2wire.HEADERS, 0x5, 2, b"\x88"), h2wire.PROTOCOL_ERROR),  # a stream never opened
        (h2wire.frame(h2wire.HEADERS, 0x1, 1, b"\x88") + h2wire.frame(h2wire.PING, 0, 0, b"\0" * 8),
         h2wire.PROTOCOL_ERROR),  # a header block interrupted
        (h2wire.frame(h2wire.WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), h2wire.PROTOCOL_ERROR),
        (h2wire.frame(h2wire.WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"), h2wire.FLOW_CONTROL_ERROR),
        (h2wire.frame(h2wire.SETTINGS, 0, 0, b"\0\5\0\0\0\1"), h2wire.PROTOCOL_ERROR),  # frame size 1
    ],
)
def test_a_server_breaking_the_protocol_gets_a_goaway_saying_why(data, code):
    pair = Pair()
    pair.request()
    pair.to_server()
    with pytest.raises(h2wire.ConnectionError_) as caught:
        pair.client.receive(data)
    assert caught.value.code == code
    (ended,) = received(pair.to_server(), h2.events.ConnectionTerminated)
    assert ended.error_code == code
    assert pair.client.capacity() == 0


@pytest.mark.parametrize("huffman", [True, False])
@pytest.mark.parametrize("keep", [None, frozenset({b"retry-after", b"x-a"})])
def test_the_decoder_reads_what_hpack_encodes_with_no_dynamic_table(huffman, keep):
    encoder = HpackEncoder()
    encoder.header_table_size = 0
    fields = [(b":status", b"200"), (b"retry-after", b"120"), (b"x-a", b"\xff" * 300), (b"date", b"Mon"),
              (b"content-type", b"application/json"), (b"x-b", b"")]  # fmt: skip
    decoder = h2wire.Decoder(keep)
    for _ in range(3):
        block = encoder.encode(fields, huffman=huffman)
        assert decoder.decode(block) == [f for f in fields if keep is None or f[0] in keep or f[0] == b":status"]
    with pytest.raises(HPACKError):
        decoder.decode(block[:-1])


@pytest.mark.parametrize(("size", "count"), [(h2wire.DEFAULT_FRAME_SIZE, 10), (1, 10 * h2wire.MAX_CONTINUATIONS)])
def test_a_header_block_without_end_is_cut_off_at_its_limit(size, count):
    pair = Pair()
    stream_id = pair.request()
    pair.to_server()
    pair.client.receive(h2wire.frame(h2wire.HEADERS, 0, stream_id, b"\x88"))  # no END_HEADERS
    continuation = h2wire.frame(h2wire.CONTINUATION, 0, stream_id, b"\x88" * size)
    taken = 0
    with pytest.raises(h2wire.ConnectionError_) as caught:
        for taken in range(1, count + 1):  # noqa: B007 - counted for the assertion below
            pair.client.receive(continuation)
    assert caught.value.code == h2wire.ENHANCE_YOUR_CALM
    assert taken * size <= h2wire.MAX_HEADER_BLOCK + size and taken <= h2wire.MAX_CONTINUATIONS + 1
    (ended,) = received(pair.to_server(), h2.events.ConnectionTerminated)
    assert ended.error_code == h2wire.ENHANCE_YOUR_CALM
    assert pair.client.capacity() == 0 and pair.client._in == b""
    pair.client.receive(continuation)  # the connection is closed: nothing more is kept
    assert pair.client._in == b""


def test_frames_read_before_a_handler_raised_are_not_read_again():
    class Raising(Recorder):
        def on_end(self, stream_id):
            super().on_end(stream_id)
            if len(self.events) == 3:  # the first answer's end only
                raise RuntimeError("a caller's bug")

    pair = Pair()
    pair.client.handler = pair.recorder = Raising()
    first, second = pair.request(b"{}"), pair.request(b"{}")
    pair.to_server()
    window = pair.client.send_window
    pair.server.increment_flow_control_window(1000)  # read before the raise: applied once
    pair.answer(first, 200, body=b"one")
    pair.answer(second, 410, body=b"two")
    with pytest.raises(RuntimeError):
        pair.to_client()
    pair.client.receive(b"")  # the rest: the first answer is not given again
    assert pair.recorder.events == [
        ("response", first, 200, []), ("data", first, b"one"), ("end", first),
        ("response", second, 410, []), ("data", second, b"two"), ("end", second),
    ]  # fmt: skip
    assert pair.client.send_window == window + 1000 and not pair.client.streams


def test_the_last_stream_ids_are_used_then_no_more_streams_start():
    pair = Pair()
    pair.client.next_stream_id = h2wire.MAX_STREAM_ID - 2
    streams = [pair.request(b"{}") for _ in range(2)]
    assert streams == [h2wire.MAX_STREAM_ID - 2, h2wire.MAX_STREAM_ID] and pair.client.capacity() == 0
    with pytest.raises(ValueError):
        pair.request(b"{}")
    pair.to_server()
    for stream_id in streams:
        pair.answer(stream_id)
    pair.to_client()
    assert pair.recorder.events == [e for s in streams for e in (("response", s, 200, []), ("end", s))]
