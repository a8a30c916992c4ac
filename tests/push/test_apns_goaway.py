"""APNs over HTTP/2 when the connection goes away mid-flight (a real TLS HTTP/2 server: the APNs
stand-in on raw h2, benchmarks.push_standins.GoawayApnsStandIn): after a graceful GOAWAY the streams
above its last-stream-id go again on a new connection, those at or below it are answered on the old
one, and no request the server processed is sent twice; a connection that dies without a GOAWAY
fails its streams in flight as transient errors and re-sends nothing by itself."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from providers.kinds import build_provider
from providers.kinds.base import OutboundMessage
from tests.push.standins import GoawayApnsStandIn

pytestmark = pytest.mark.timeout(60)


def message(token: str) -> OutboundMessage:
    return OutboundMessage(notification_id=str(uuid.uuid4()), tenant_id=str(uuid.uuid4()), channel="push",
                           recipient=token, subject="Your order", body="It has shipped")  # fmt: skip


def send_all(standin: GoawayApnsStandIn, tokens: list[str]) -> tuple[list, object]:
    provider = build_provider("apns", *standin.provider_config())

    async def main():
        try:
            return await asyncio.gather(*(provider.send(message(t)) for t in tokens))
        finally:
            await provider.aclose()

    return asyncio.run(main()), provider


@pytest.fixture
def goaway(tmp_path):
    standin = GoawayApnsStandIn(tmp_path, goaway_after=10).start()
    yield standin
    standin.stop()


@pytest.fixture
def dying(tmp_path):
    standin = GoawayApnsStandIn(tmp_path, goaway_after=0, die_after=10).start()
    yield standin
    standin.stop()


def test_after_goaway_the_unprocessed_streams_go_again_and_nothing_processed_twice(goaway):
    tokens = [f"{i:02x}" * 32 for i in range(40)]
    results, provider = send_all(goaway, tokens)

    assert all(r.delivered for r in results), [r for r in results if not r.delivered][:3]
    assert len(goaway.last_stream_ids) == 1 and goaway.ignored > 0  # the GOAWAY landed with streams above it
    assert provider._client.connections_opened == 2
    # every device got its push exactly once: the streams at or below last-stream-id were answered
    # (after the GOAWAY) on the first connection and not sent again; those above went on the second
    assert sorted(r["token"] for r in goaway.received) == sorted(tokens)
    assert all(count == 1 for count in goaway.seen.values()) and goaway.refused == []


def test_a_connection_that_dies_fails_its_streams_in_flight_as_transient(dying):
    from dlq.classifier import classify

    tokens = [f"{i:02x}" * 32 for i in range(40)]
    results, _ = send_all(dying, tokens)

    failed = [r for r in results if not r.delivered]
    assert failed and all(r.error_code == "connect_error" or not classify(r).permanent for r in failed)
    # nothing is sent again by the transport: what the server processed before it died, once
    assert all(count == 1 for count in dying.seen.values())
    assert len(dying.received) + len(failed) == len(tokens)


def test_a_stream_unanswered_by_its_deadline_times_out_and_the_connection_serves_the_next(tmp_path):
    from core.http import HttpTimeout, split_url
    from core.http.h2 import H2Client, h2_ssl_context

    slow = GoawayApnsStandIn(tmp_path, goaway_after=0, answer_delay=1.0).start()
    try:
        origin, _ = split_url(slow.base_url)
        client = H2Client(origin, guard=lambda host, addresses: None, ssl_context=h2_ssl_context(slow.tls.cafile))
        path, body = "/3/device/" + "ab" * 32, b'{"aps":{}}'

        async def main():
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(HttpTimeout):
                await client.request("POST", path, [], body, timeout=0.2)
            waited = loop.time() - started
            answer = await client.request("POST", path, [], body, timeout=5.0)  # after the late answer
            await client.aclose()
            return waited, answer

        waited, answer = asyncio.run(main())
    finally:
        slow.stop()
    assert 0.2 <= waited < 0.9  # the deadline (and the sweep's resolution), not the late answer
    assert answer.status == 403 and client.connections_opened == 1  # no provider token: refused, answered
