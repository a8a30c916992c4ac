"""Webhook provider and the HTTP client under it, against real loopback servers."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import socket
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from rest_framework.exceptions import ValidationError
from standardwebhooks import Webhook

from core.http import HttpClient, HttpProtocolError, split_url
from dlq.classifier import classify
from providers.kinds import REGISTRY, build_provider
from providers.kinds.base import OutboundMessage
from providers.kinds.webhook import WebhookProvider
from providers.transport import new_client
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver, make_tls_material, spawn_receiver

SECRETS = {"signing_secret": TEST_SIGNING_SECRET}


def message(**overrides) -> OutboundMessage:
    fields = {
        "notification_id": str(uuid.uuid4()),
        "tenant_id": str(uuid.uuid4()),
        "channel": "webhook",
        "recipient": "https://customer.example/hooks/abc",
        "subject": "Order shipped",
        "body": "Your order #42 has shipped — ünïcode ✓",
        "metadata": {"order": 42, "tags": ["a", "b"]},
        "created_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "attempt": 1,
    }
    fields.update(overrides)
    return OutboundMessage(**fields)


def deliver(url: str, *messages: OutboundMessage, config: dict | None = None, client: HttpClient | None = None):
    """Send messages one after another through one provider; return the results."""

    async def run():
        provider = build_provider("webhook", {"url": url, **(config or {})}, SECRETS, http_client=client)
        try:
            return [await provider.send(m) for m in messages]
        finally:
            await provider.aclose()
            if client is not None:
                await client.aclose()

    return asyncio.run(run())


@pytest.fixture
def receiver():
    with HttpReceiver(secret=TEST_SIGNING_SECRET) as rx:
        yield rx


def test_registry_knows_every_kind():
    kinds = {"webhook", "smtp", "twilio", "sendgrid", "ses", "console", "fcm", "apns", "webpush", "inbox"}
    assert set(REGISTRY) == kinds
    with pytest.raises(ValueError, match="unknown provider kind"):
        build_provider("fax", {}, {})


def test_signed_post_verifies_with_standardwebhooks(receiver):
    msg = message()
    [result] = deliver(receiver.url, msg)
    assert result.delivered and result.http_status == 200
    [req] = receiver.requests
    assert req.verified is True
    # Verify again here, independently of the receiver, and check the payload shape.
    payload = Webhook(TEST_SIGNING_SECRET).verify(req.body, req.headers)
    assert payload == {
        "id": msg.notification_id,
        "channel": "webhook",
        "recipient": msg.recipient,
        "subject": msg.subject,
        "body": msg.body,
        "metadata": msg.metadata,
        "created_at": "2026-01-02T03:04:05+00:00",
    }
    assert req.method == "POST" and req.path == "/hook"
    assert req.headers["webhook-id"] == msg.notification_id
    assert req.headers["idempotency-key"] == msg.notification_id
    assert req.headers["content-type"] == "application/json"
    assert abs(int(req.headers["webhook-timestamp"]) - time.time()) < 5
    # v1,<base64 HMAC-SHA256> of "{id}.{timestamp}.{body}"
    version, signature = req.headers["webhook-signature"].split(",")
    assert version == "v1" and len(base64.b64decode(signature)) == 32


def test_signature_with_another_secret_is_rejected_by_the_receiver():
    other = "whsec_" + base64.b64encode(b"x" * 32).decode()
    with HttpReceiver(secret=other) as rx:
        [result] = deliver(rx.url, message())
        assert rx.requests[0].verified is False
        assert result.http_status == 400 and classify(result).outcome == "permanent_error"


def test_webhook_id_is_constant_across_retries_and_connection_is_reused(receiver):
    first = message(attempt=1)
    retry = message(notification_id=first.notification_id, attempt=2)
    results = deliver(receiver.url, first, retry, message(), message())
    assert all(r.delivered for r in results)
    ids = [r.webhook_id for r in receiver.requests]
    assert ids[0] == ids[1] == first.notification_id
    stats = receiver.stats()
    assert stats["connections"] == 1  # keep-alive
    assert stats["duplicate_accepts"] == 1 and stats["verified"] == 4


@pytest.mark.parametrize(
    ("status", "outcome", "code"),
    [
        (200, "delivered", ""),
        (201, "delivered", ""),
        (202, "delivered", ""),
        (204, "delivered", ""),
        (400, "permanent_error", "http_400"),
        (401, "permanent_error", "http_401"),
        (403, "permanent_error", "http_403"),
        (404, "permanent_error", "http_404"),
        (410, "permanent_error", "http_410"),
        (408, "transient_error", "http_408"),
        (425, "transient_error", "http_425"),
        (429, "transient_error", "http_429"),
        (500, "transient_error", "http_500"),
        (502, "transient_error", "http_502"),
        (503, "transient_error", "http_503"),
    ],
)
def test_status_codes_classify(receiver, status, outcome, code):
    receiver.configure(status=status)
    [result] = deliver(receiver.url, message())
    assert result.http_status == status
    verdict = classify(result)
    assert (verdict.outcome, verdict.error_code) == (outcome, code)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirects_are_not_followed_and_are_permanent(receiver, status):
    receiver.configure(status=status, location="http://169.254.169.254/latest/meta-data/")
    [result] = deliver(receiver.url, message())
    assert (result.delivered, result.error_code, result.permanent, result.http_status) == (
        False,
        "redirect",
        True,
        status,
    )
    assert receiver.stats()["requests"] == 1
    assert classify(result).outcome == "permanent_error"


def test_retry_after_seconds_and_http_date(receiver):
    receiver.configure(status=503, retry_after="7")
    [seconds] = deliver(receiver.url, message())
    assert seconds.retry_after == 7.0 and classify(seconds).retry_after == 7.0
    when = datetime.now(UTC) + timedelta(seconds=120)
    receiver.configure(status=429, retry_after=format_datetime(when, usegmt=True))
    [dated] = deliver(receiver.url, message())
    assert 110 <= dated.retry_after <= 121


def test_rate_limited_receiver_answers_429_with_retry_after():
    with HttpReceiver(secret=TEST_SIGNING_SECRET, rate_limit=2) as rx:
        results = deliver(rx.url, *(message() for _ in range(5)))
    limited = [r for r in results if r.http_status == 429]
    assert limited and all(r.retry_after == 1.0 and classify(r).outcome == "transient_error" for r in limited)
    assert sum(r.delivered for r in results) >= 2


def test_error_message_is_masked(receiver):
    receiver.configure(status=422, error_body=b'{"error":"bad recipient jane.doe@example.com +15551234567"}')
    [result] = deliver(receiver.url, message())
    assert "jane.doe@example.com" not in result.message and "+15551234567" not in result.message
    assert "j***@example.com" in result.message and "HTTP 422" in result.message
    assert TEST_SIGNING_SECRET not in result.message


def test_timeout_is_transient_and_bounded(receiver):
    receiver.configure(delay_ms=600)
    started = time.monotonic()
    [result] = deliver(receiver.url, message(), config={"timeout_seconds": 0.15})
    assert time.monotonic() - started < 0.5
    assert (result.error_code, result.error_class) == ("timeout", "HttpTimeout")
    assert classify(result).outcome == "transient_error"


def test_connection_refused_is_connect_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    [result] = deliver(f"http://127.0.0.1:{port}/hook", message())
    assert (result.delivered, result.error_code) == (False, "connect_error")
    assert classify(result).failure_class == "transient"


def test_unresolvable_host_is_dns_error():
    [result] = deliver("http://no-such-host.invalid/hook", message())
    assert result.error_code == "dns_error"
    assert classify(result).failure_class == "transient"


def test_connection_close_and_chunked_responses(receiver):
    receiver.configure(close=True, chunked=True)
    results = deliver(receiver.url, message(), message(), message())
    assert all(r.delivered for r in results)
    assert receiver.stats()["connections"] == 3  # each response said Connection: close


def test_idle_connection_closed_by_server_is_replaced_transparently(receiver):
    async def run():
        client = new_client()
        provider = WebhookProvider({"url": receiver.url}, SECRETS, http_client=client)
        first = await provider.send(message())
        # The server drops the idle keep-alive connection; the client has not noticed yet.
        receiver.drop_connections()
        second = await provider.send(message())
        await client.aclose()
        return first, second

    first, second = asyncio.run(run())
    assert first.delivered and second.delivered
    assert receiver.stats()["connections"] == 2 and receiver.stats()["accepted"] == 2


def test_pool_limits_connections_under_concurrency():
    with HttpReceiver(secret=TEST_SIGNING_SECRET, delay_ms=20) as rx:

        async def run():
            client = new_client(max_connections_per_host=4)
            provider = WebhookProvider({"url": rx.url}, SECRETS, http_client=client)
            results = await asyncio.gather(*(provider.send(message()) for _ in range(40)))
            await client.aclose()
            return results

        results = asyncio.run(run())
        assert all(r.delivered for r in results)
        stats = rx.stats()
        assert stats["verified"] == 40 and stats["accepted_unique"] == 40
        assert stats["connections"] <= 4


def test_waiting_for_a_pool_slot_counts_against_the_timeout():
    with HttpReceiver(secret=TEST_SIGNING_SECRET, delay_ms=400) as rx:

        async def run():
            client = new_client(max_connections_per_host=1)
            provider = WebhookProvider({"url": rx.url, "timeout_seconds": 0.1}, SECRETS, http_client=client)
            started = time.monotonic()
            results = await asyncio.gather(*(provider.send(message()) for _ in range(3)))
            elapsed = time.monotonic() - started
            # The slot is free again afterwards.
            rx.configure(delay_ms=0)
            provider.timeout = 2.0
            after = await provider.send(message())
            await client.aclose()
            return results, elapsed, after

        results, elapsed, after = asyncio.run(run())
        assert [r.error_code for r in results] == ["timeout"] * 3
        assert elapsed < 0.4
        assert after.delivered


def test_a_pool_waiter_times_out_while_the_only_connection_is_still_being_opened():
    """Nothing is in flight (the one connection is still resolving its host), yet the send waiting
    for a slot fails at its own deadline: the client's sweeper runs for waiters too."""
    with HttpReceiver(secret=TEST_SIGNING_SECRET) as rx:

        async def run():
            answer = asyncio.Event()

            async def slow_dns(host, port):
                await answer.wait()
                return await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)

            client = new_client(max_connections_per_host=1, resolver=slow_dns)
            opener = WebhookProvider({"url": rx.url, "timeout_seconds": 5.0}, SECRETS, http_client=client)
            waiter = WebhookProvider({"url": rx.url, "timeout_seconds": 0.15}, SECRETS, http_client=client)
            first = asyncio.create_task(opener.send(message()))
            await asyncio.sleep(0)  # the first send takes the only slot and starts resolving
            started = time.monotonic()
            late = await asyncio.wait_for(waiter.send(message()), 3)
            waited = time.monotonic() - started
            still_opening = not first.done()
            answer.set()
            delivered = await first
            await client.aclose()
            return late, waited, still_opening, delivered

        late, waited, still_opening, delivered = asyncio.run(run())
    assert late.error_code == "timeout" and waited < 1.0
    assert still_opening, "the slot holder was still resolving when the waiter gave up"
    assert delivered.delivered and len(rx.requests) == 1


def test_a_pool_waiter_with_a_shorter_timeout_expires_behind_one_with_a_longer_timeout():
    """Waiters are expired from the left while their deadlines are in order; one queued behind a
    later deadline (two timeouts on one origin) still fails at its own."""
    with HttpReceiver(secret=TEST_SIGNING_SECRET, delay_ms=600) as rx:

        async def run():
            client = new_client(max_connections_per_host=1)
            patient = WebhookProvider({"url": rx.url, "timeout_seconds": 5.0}, SECRETS, http_client=client)
            hasty = WebhookProvider({"url": rx.url, "timeout_seconds": 0.15}, SECRETS, http_client=client)
            holder = asyncio.create_task(patient.send(message()))  # takes the only connection
            await asyncio.sleep(0.05)
            queued_first = asyncio.create_task(patient.send(message()))
            await asyncio.sleep(0)
            started = time.monotonic()
            late = await asyncio.wait_for(hasty.send(message()), 3)
            waited = time.monotonic() - started
            results = await asyncio.gather(holder, queued_first)
            await client.aclose()
            return late, waited, results

        late, waited, results = asyncio.run(run())
    assert late.error_code == "timeout" and waited < 0.5
    assert [r.delivered for r in results] == [True, True]


def test_https_with_sni_and_certificate_verification(tmp_path):
    tls = make_tls_material(tmp_path)
    with HttpReceiver(secret=TEST_SIGNING_SECRET, ssl_context=tls.server_context) as rx:
        url = f"https://localhost:{rx.port}/hook"
        [ok] = deliver(url, message(), client=new_client(ssl_context=tls.client_context()))
        assert ok.delivered and rx.requests[0].verified
        assert "localhost" in tls.sni_names
        # The default context does not trust the self-signed certificate.
        [refused] = deliver(url, message())
        assert (refused.error_code, refused.error_class) == ("tls_error", "HttpTlsError")


def test_unserialisable_metadata_is_malformed_content(receiver):
    [result] = deliver(receiver.url, message(metadata={"when": object()}))
    assert (result.error_code, result.permanent) == ("malformed_content", True)
    assert receiver.stats()["requests"] == 0


def test_receiver_subprocess_verifies_and_reports_counts():
    with spawn_receiver("--secret", TEST_SIGNING_SECRET, "--max-seconds", "30") as proc:
        results = deliver(proc.url, *(message() for _ in range(5)))
        assert all(r.delivered for r in results)
        assert proc.stats()["verified"] == 5
        final = proc.stop()
    assert final["event"] == "stopped" and final["reason"] == "SIGTERM"
    assert (final["requests"], final["verified"], final["accepted_unique"]) == (5, 5, 5)


def test_receiver_subprocess_stops_by_itself_after_expected_count():
    with spawn_receiver("--secret", TEST_SIGNING_SECRET, "--expect", "2", "--max-seconds", "30") as proc:
        deliver(proc.url, message(), message())
        proc.proc.wait(5)
        final = proc.stop()
    assert final["reason"] == "expected_count_reached" and final["accepted_unique"] == 2


def test_receiver_can_sample_signature_checks():
    with HttpReceiver(secret=TEST_SIGNING_SECRET, verify_every=2) as rx:
        assert all(r.delivered for r in deliver(rx.url, *(message() for _ in range(4))))
        stats = rx.stats()
    assert (stats["verified"], stats["unverified"], stats["invalid_signature"]) == (2, 2, 0)


def test_provider_survives_being_used_from_a_new_event_loop(receiver):
    provider = WebhookProvider({"url": receiver.url}, SECRETS)
    with warnings.catch_warnings():
        # The first loop's idle connection can only be dropped (its loop is closed): GC closes it.
        warnings.simplefilter("ignore", ResourceWarning)
        first = asyncio.run(provider.send(message()))
        second = asyncio.run(provider.send(message()))
        asyncio.run(provider.aclose())
        gc.collect()
    assert first.delivered and second.delivered
    assert receiver.stats()["connections"] == 2


# -- validation ----------------------------------------------------------------------------
def test_validate_normalises_config():
    config = WebhookProvider.validate({"url": "https://hooks.example.com/x?y=1"}, SECRETS, check_destination=False)
    assert config == {"url": "https://hooks.example.com/x?y=1", "timeout_seconds": 10.0}
    # Whitespace around a URL is refused like whitespace inside it (core.http.split_url), not trimmed.
    with pytest.raises(ValidationError) as refused:
        WebhookProvider.validate({"url": " https://hooks.example.com/x?y=1 "}, SECRETS, check_destination=False)
    assert "url" in refused.value.detail["config"]


@pytest.mark.parametrize(
    ("config", "secrets", "section", "field"),
    [
        ({}, SECRETS, "config", "url"),
        ({"url": "ftp://example.com/x"}, SECRETS, "config", "url"),
        ({"url": "https://user:pw@example.com/x"}, SECRETS, "config", "url"),
        ({"url": "https:///nohost"}, SECRETS, "config", "url"),
        ({"url": "https://example.com:99999/"}, SECRETS, "config", "url"),
        ({"url": "https://example.com/", "timeout_seconds": 0}, SECRETS, "config", "timeout_seconds"),
        ({"url": "https://example.com/", "timeout_seconds": 500}, SECRETS, "config", "timeout_seconds"),
        ({"url": "https://example.com/", "timeout_seconds": "10"}, SECRETS, "config", "timeout_seconds"),
        ({"url": "https://example.com/", "verify": False}, SECRETS, "config", "verify"),
        ({"url": "https://example.com/"}, {}, "secrets", "signing_secret"),
        ({"url": "https://example.com/"}, {"signing_secret": "plain-secret"}, "secrets", "signing_secret"),
        ({"url": "https://example.com/"}, {"signing_secret": "whsec_!!notbase64"}, "secrets", "signing_secret"),
        ({"url": "https://example.com/"}, {"signing_secret": "whsec_dGVzdA=="}, "secrets", "signing_secret"),
    ],
)
def test_validate_rejects_bad_config_with_field_messages(config, secrets, section, field):
    with pytest.raises(ValidationError) as excinfo:
        WebhookProvider.validate(config, secrets, check_destination=False)
    messages = excinfo.value.detail[section][field]
    assert messages and all(str(m) for m in messages)


def test_secret_value_never_appears_in_validation_errors():
    secret = "whsec_dGVzdA=="
    with pytest.raises(ValidationError) as excinfo:
        WebhookProvider.validate({"url": "https://example.com/"}, {"signing_secret": secret})
    assert "dGVzdA" not in json.dumps(excinfo.value.detail)


# -- HTTP parser edge cases against a raw server ---------------------------------------------
async def _raw_exchange(chunks: list[bytes], *, byte_by_byte: bool = False, close_after: bool = False, **client_kw):
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        for chunk in chunks:
            if byte_by_byte:
                for i in range(len(chunk)):
                    writer.write(chunk[i : i + 1])
                    await writer.drain()
            else:
                writer.write(chunk)
                await writer.drain()
        if close_after:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = new_client(**client_kw)
    try:
        return await client.request("POST", f"http://127.0.0.1:{port}/x", body=b"{}", timeout=2)
    finally:
        await client.aclose()
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.01)


def test_parser_skips_100_continue_and_reads_chunked_body_with_trailers_byte_by_byte():
    response = asyncio.run(
        _raw_exchange(
            [
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\nX-A: 2\r\n\r\n",
                b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n",
            ],
            byte_by_byte=True,
        )
    )
    assert (response.status, response.body, response.header("x-a")) == (200, b"hello world", "1, 2")


def test_parser_reads_body_delimited_by_close_and_truncates_large_bodies():
    response = asyncio.run(_raw_exchange([b"HTTP/1.0 200 OK\r\n\r\n", b"abc"], close_after=True))
    assert (response.status, response.body) == (200, b"abc")
    big = asyncio.run(
        _raw_exchange([b"HTTP/1.1 500 Oops\r\nContent-Length: 100000\r\n\r\n", b"x" * 100000], max_body_bytes=1000)
    )
    assert (big.status, big.reason, len(big.body), big.truncated) == (500, "Oops", 1000, True)


def test_parser_rejects_garbage():
    with pytest.raises(HttpProtocolError):
        asyncio.run(_raw_exchange([b"SSH-2.0-OpenSSH\r\n\r\n"]))


def test_split_url_builds_host_header_and_target():
    origin, target = split_url("https://Hooks.Example.com:8443/a/b?c=d")
    assert (origin.scheme, origin.host, origin.port, origin.host_header, target) == (
        "https",
        "hooks.example.com",
        8443,
        b"hooks.example.com:8443",
        "/a/b?c=d",
    )
    origin, target = split_url("http://[::1]/")
    assert (origin.host, origin.host_header, target) == ("::1", b"[::1]", "/")
    with pytest.raises(ValueError, match="credentials"):
        split_url("http://u:p@example.com/")


def test_payload_json_is_compact_utf8_and_keeps_big_integers():
    from providers.kinds.webhook import _json

    payload = {"name": "Zoë ✉", "n": 1, "m": {"k": [1, None]}}
    assert _json(payload) == '{"name":"Zoë ✉","n":1,"m":{"k":[1,null]}}'.encode()
    assert json.loads(_json({"n": 2**70})) == {"n": 2**70}  # beyond orjson: the standard library takes over


@pytest.mark.parametrize(
    "when",
    [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999_999, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    ],
)
def test_payload_datetimes_read_as_isoformat_writes_them(when):
    """orjson formats created_at; both paths (and the big-integer fallback) write isoformat()."""
    from providers.kinds.webhook import _json

    assert json.loads(_json({"created_at": when})) == {"created_at": when.isoformat()}
    assert json.loads(_json({"created_at": when, "n": 2**70})) == {"created_at": when.isoformat(), "n": 2**70}
    with pytest.raises(TypeError):
        _json({"created_at": when, "n": 2**70, "odd": object()})
