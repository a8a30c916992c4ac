"""core.http.h2's H2Client against a real TLS HTTP/2 server (the APNs stand-in on raw h2): a request
callback that raises, and a connection whose stream ids run out; and against a raw peer streaming
CONTINUATION frames without end."""

from __future__ import annotations

import asyncio

import pytest

from core.http import h2wire, split_url
from core.http.h2 import H2Client, h2_ssl_context
from tests.push.standins import GoawayApnsStandIn

pytestmark = pytest.mark.timeout(60)
PATH, BODY = "/3/device/" + "ab" * 32, b'{"aps":{}}'


@pytest.fixture
def server(tmp_path):
    standin = GoawayApnsStandIn(tmp_path, goaway_after=0, answer_delay=0.0).start()
    yield standin
    standin.stop()


def client_of(standin: GoawayApnsStandIn) -> H2Client:
    origin, _ = split_url(standin.base_url)
    return H2Client(origin, guard=lambda host, addresses: None, ssl_context=h2_ssl_context(standin.tls.cafile))


def test_a_callback_that_raises_does_not_disturb_the_next_answers(server):
    client = client_of(server)
    reported = []

    def raising(response, error):
        raise RuntimeError("a caller's bug")

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: reported.append(context))
        try:
            for _ in range(3):  # the raising callback's answer lands among the others' frames
                client.start("POST", PATH, [], BODY, 5.0, raising)
                answers = await asyncio.gather(*(client.request("POST", PATH, [], BODY, 5.0) for _ in range(5)))
                assert [a.status for a in answers] == [403] * 5  # no provider token: refused, answered
            return await client.request("POST", PATH, [], BODY, 5.0)
        finally:
            await client.aclose()

    last = asyncio.run(main())
    assert last.status == 403 and client.connections_opened == 1
    assert [type(c["exception"]) for c in reported] == [RuntimeError] * 3


def test_a_connection_out_of_stream_ids_drains_and_the_next_requests_go_on_a_new_one(server):
    client = client_of(server)

    async def main():
        try:
            first = await client.request("POST", PATH, [], BODY, 5.0)  # opens the connection
            old = client._protocol
            old.conn.next_stream_id = h2wire.MAX_STREAM_ID - 2  # two stream ids left
            answers = await asyncio.gather(*(client.request("POST", PATH, [], BODY, 5.0) for _ in range(5)))
            assert old.closed and client._protocol is not old
            later = await client.request("POST", PATH, [], BODY, 5.0)
            return [first, *answers, later]
        finally:
            await client.aclose()

    answers = asyncio.run(main())
    assert [a.status for a in answers] == [403] * 7  # no provider token: refused, answered
    assert client.connections_opened == 2 and server.connections == 2


def test_endless_continuations_fail_the_streams_in_flight_as_transient():
    from core.http.h2 import H2Request, _H2Protocol
    from dlq.classifier import TRANSIENT_CODES

    class Transport:
        def __init__(self):
            self.written = bytearray()
            self.aborted = False

        def write(self, data):
            self.written += data

        def abort(self):
            self.aborted = True

        def close(self):
            self.aborted = True

    origin, _ = split_url("https://localhost:1")
    client = H2Client(origin, guard=lambda host, addresses: None)
    protocol = _H2Protocol(client)
    transport = Transport()
    protocol.connection_made(transport)
    results = []
    request = H2Request(client, [(b":method", b"POST"), (b":path", b"/")], b"", 0.0, lambda *r: results.append(r))
    protocol.start(request)
    stream_id = request.stream_id
    protocol.data_received(h2wire.frame(h2wire.HEADERS, 0, stream_id, b"\x88"))
    continuation = h2wire.frame(h2wire.CONTINUATION, 0, stream_id, b"\x88" * h2wire.DEFAULT_FRAME_SIZE)
    for _ in range(10):
        protocol.data_received(continuation)
    ((response, error),) = results
    assert response is None and error.code in TRANSIENT_CODES and protocol.closed and transport.aborted
    goaway = h2wire.frame(h2wire.GOAWAY, 0, 0, b"\0\0\0\0" + bytes((0, 0, 0, h2wire.ENHANCE_YOUR_CALM)))
    assert transport.written.endswith(goaway)
