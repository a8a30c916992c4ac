"""SMTP deadlines that hold: one deadline for the whole dialogue, kept by closing the socket from
outside; a pool of SMTP threads of its own with a share per provider; a cancelled or expired send
cannot deliver later. Against real aiosmtpd tarpits on loopback, and a real dispatcher process."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from dlq.classifier import classify
from notifications.models import DeliveryAttempt, Notification
from providers.kinds import build_provider, smtp
from providers.kinds.base import OutboundMessage
from queueing.models import QueueItem
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import SmtpSink, _LoopThread

FROM = "alerts@omnipost.example"


class Tarpit:
    """An aiosmtpd server that answers one line every `line_delay` seconds (the greeting included).
    Records each connection's commands, when the client closed it (its FIN, seen at once even while
    the server sleeps before a line), and any message it accepted."""

    def __init__(self, line_delay: float) -> None:
        self.line_delay = line_delay
        self.messages: list[bytes] = []
        self.opened: list[float] = []
        self.closed: list[float] = []
        self.commands: list[str] = []
        self.lock = threading.Lock()
        self.port = 0

    async def _start(self) -> None:
        from aiosmtpd.smtp import SMTP

        tarpit = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):  # noqa: ANN001, ANN201
                with tarpit.lock:
                    tarpit.messages.append(envelope.original_content or b"")
                return "250 accepted"

        class SlowSMTP(SMTP):
            def connection_made(self, transport):  # noqa: ANN001, ANN202
                with tarpit.lock:
                    tarpit.opened.append(time.monotonic())
                super().connection_made(transport)

            def eof_received(self):  # noqa: ANN202 - the client closed its side (FIN)
                self._client_gone()
                return super().eof_received()

            def connection_lost(self, exc):  # noqa: ANN001, ANN202
                self._client_gone()
                super().connection_lost(exc)

            def _client_gone(self) -> None:
                with tarpit.lock:
                    if not getattr(self, "_gone", False):
                        self._gone = True
                        tarpit.closed.append(time.monotonic())

            async def push(self, status):  # noqa: ANN001, ANN202
                await asyncio.sleep(tarpit.line_delay)
                await super().push(status)

            async def _call_handler_hook(self, command, *args):  # noqa: ANN001, ANN202
                with tarpit.lock:
                    tarpit.commands.append(command)
                return await super()._call_handler_hook(command, *args)

        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: SlowSMTP(Handler(), hostname="tarpit.omnipost.test", loop=loop), "127.0.0.1", 0
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self.server.close()

    def __enter__(self) -> Tarpit:
        import logging

        logging.getLogger("mail.log").setLevel(logging.WARNING)
        self.thread = _LoopThread("tarpit")
        self.thread.start()
        self.thread.run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.run(self._stop())
        self.thread.stop()

    def counts(self) -> tuple[int, int, int]:
        with self.lock:
            return len(self.opened), len(self.closed), len(self.messages)


def message(recipient: str = "jane.doe@example.com") -> OutboundMessage:
    return OutboundMessage(
        notification_id=str(uuid.uuid4()), tenant_id=str(uuid.uuid4()), channel="email", recipient=recipient,
        subject="Hello", body="Body", metadata={}, created_at=datetime.now(UTC),
    )  # fmt: skip


def provider(port: int, timeout: float):  # noqa: ANN201
    config = {"host": "127.0.0.1", "port": port, "from_email": FROM, "timeout_seconds": timeout}
    return build_provider("smtp", config, {})


def test_timeout_seconds_is_validated():
    from rest_framework.exceptions import ValidationError

    base = {"host": "h.example", "from_email": FROM}
    assert smtp.SmtpProvider.validate({**base, "timeout_seconds": 2}, {}, check_destination=False)[
        "timeout_seconds"
    ] == 2.0
    for bad in (0, -1, 121, "5", True, float("nan")):
        with pytest.raises(ValidationError) as err:
            smtp.SmtpProvider.validate({**base, "timeout_seconds": bad}, {}, check_destination=False)
        assert "timeout_seconds" in err.value.detail["config"]


def test_a_tarpit_fails_at_the_deadline_as_transient_and_its_socket_is_closed():
    with Tarpit(line_delay=20) as tarpit:
        t0 = time.monotonic()
        result = asyncio.run(provider(tarpit.port, 0.5).send(message()))
        took = time.monotonic() - t0
        assert (result.delivered, result.error_code) == (False, "timeout")
        assert classify(result).outcome == "transient_error"
        assert 0.45 <= took < 1.5, took
        # The connection was shut down at the deadline, not left to the server's next line.
        assert wait_until(lambda: tarpit.counts()[1] == 1, 2, interval=0.02)
        assert tarpit.closed[0] - t0 < 1.5


def test_the_deadline_is_for_the_whole_dialogue_not_each_line():
    """Every line comes well within any per-operation timeout; the dialogue as a whole does not."""
    with Tarpit(line_delay=0.15) as tarpit:
        t0 = time.monotonic()
        result = asyncio.run(provider(tarpit.port, 0.6).send(message()))
        assert result.error_code == "timeout" and time.monotonic() - t0 < 1.2
        assert wait_until(lambda: tarpit.counts()[1] == 1, 2, interval=0.02)
        time.sleep(0.3)  # the lines a finished dialogue would have needed (≥ 10 × 0.15 s from t0)
        assert tarpit.messages == [], "the aborted send delivered afterwards"
        assert "DATA" not in tarpit.commands


def test_cancel_closes_the_connection_at_once_and_never_calls_back():
    results = []

    async def scenario(port: int) -> None:
        prov = provider(port, 30)
        handle = prov.start_send(message(), results.append)
        await asyncio.sleep(0.3)  # connected, waiting for the greeting
        handle.cancel()
        await asyncio.sleep(0.3)

    with Tarpit(line_delay=0.2) as tarpit:
        asyncio.run(scenario(tarpit.port))
        assert tarpit.counts()[:2] == (1, 1), "cancel() closed the connection"
        time.sleep(0.3)
        assert results == [] and tarpit.messages == []


def test_one_providers_slow_server_cannot_take_every_smtp_thread(monkeypatch, settings):
    settings.OMNIPOST_SMTP_THREADS_PER_PROVIDER = 2
    monkeypatch.setattr(smtp, "_pool", ThreadPoolExecutor(max_workers=3, thread_name_prefix="test-smtp"))

    async def scenario(tarpit_port: int, sink_port: int) -> tuple[list, list[bool]]:
        slow = provider(tarpit_port, 8)  # a deadline the fast sends beat however loaded the machine
        fast = provider(sink_port, 5)
        stuck = [asyncio.ensure_future(slow.send(message())) for _ in range(6)]
        await asyncio.sleep(0.1)
        ok = await asyncio.gather(*(fast.send(message(f"r{i}@example.com")) for i in range(5)))
        slow_done_by_then = [s.done() for s in stuck]
        slow_results = await asyncio.gather(*stuck)
        return [r.delivered for r in ok] + [r.error_code for r in slow_results], slow_done_by_then

    with Tarpit(line_delay=20) as tarpit, SmtpSink() as sink:
        outcome, slow_done = asyncio.run(scenario(tarpit.port, sink.port))
        assert outcome == [True] * 5 + ["timeout"] * 6
        # the other provider's sends were all through while every tarpit send still waited for its
        # deadline: they did not queue behind the tarpit's threads
        assert slow_done == [False] * 6, "the other provider's sends waited for the tarpit's"
        assert len(sink.messages) == 5
        # Two threads at a time for the tarpit's provider: the other four waited, within their deadline.
        assert tarpit.counts()[0] == 2
    smtp._pool.shutdown(wait=True)


# --- a real dispatcher process --------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_tarpit_send_fails_at_deadline_others_go_out_and_sigterm_aborts_the_rest(
    tenant_a, tenant_b, subprocess_env, tmp_path
):
    """One overall deadline per send: the tarpit's send fails at its deadline as transient while another tenant's
    sends go out; after SIGTERM the send still in flight is aborted and delivers nothing later."""
    env = {**subprocess_env, "OMNIPOST_RETRY_BASE_SECONDS": "600"}
    with Tarpit(line_delay=20) as tarpit, Tarpit(line_delay=1.2) as slowpoke, SmtpSink(max_seconds=60) as sink:
        def smtp_provider(tenant, name, port, timeout):  # noqa: ANN001, ANN202
            config = {"host": "127.0.0.1", "port": port, "from_email": FROM, "timeout_seconds": timeout}
            return factories.provider(tenant, name, channel="email", kind="smtp", config=config, secrets={})

        # A deadline long enough for the other tenant's ten sends to go out first on a loaded machine.
        [trapped] = factories.queued(tenant_a, smtp_provider(tenant_a, "tarpit", tarpit.port, 4.0), 1,
                                     recipient="trapped@example.com")
        # A send whose dialogue would reach DATA after ≈ 11 s (9 lines, 1.2 s each): in flight at SIGTERM.
        [aborted] = factories.queued(tenant_a, smtp_provider(tenant_a, "slowpoke", slowpoke.port, 60), 1,
                                     recipient="aborted@example.com")
        others = factories.queued(tenant_b, smtp_provider(tenant_b, "mail", sink.port, 5), 10,
                                  recipient="someone@example.com")
        (proc,) = start_dispatchers(1, env, "--grace-seconds", "0.5", "--concurrency", "20", log_dir=tmp_path)
        assert wait_started(tmp_path, 1)

        assert sink.wait_for(10, timeout=10), "the other tenant's sends went out"
        assert not DeliveryAttempt.objects.filter(notification=trapped).exists(), "… while the tarpit held its send"
        assert wait_until(lambda: DeliveryAttempt.objects.filter(notification=trapped).exists(), 10)
        attempt = DeliveryAttempt.objects.get(notification=trapped)
        assert (attempt.outcome, attempt.error_code) == ("transient_error", "timeout")
        assert 3900 <= attempt.duration_ms < 6000, attempt.duration_ms
        assert Notification.objects.get(pk=trapped.pk).status == "retrying"

        assert slowpoke.counts() == (1, 0, 0), "the slow send is in flight"
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert wait_exit([proc], 10) == [0]
        assert time.monotonic() - signalled < 4, "the dispatcher did not wait for the stuck thread"
        assert slowpoke.counts()[1] == 1 and slowpoke.closed[0] - signalled < 2.5, "its socket was closed"
        # Nothing was delivered by the aborted send, nor can be: the process that held it has exited and
        # its socket was closed before the dialogue reached DATA (the client waits for each answer, so
        # no DATA was written ahead of the close).
        assert slowpoke.messages == [] and "DATA" not in slowpoke.commands
    assert Notification.objects.filter(pk__in=[n.pk for n in others], status="delivered").count() == 10
    assert Notification.objects.get(pk=aborted.pk).status in ("queued", "retrying")
    assert not QueueItem.objects.filter(notification_id=aborted.pk, lock_token__isnull=False).exists(), "given back"
    assert not DeliveryAttempt.objects.filter(notification=aborted, outcome="delivered").exists()
    assert "SIGTERM received" in (tmp_path / "dispatcher0.log").read_text()


# --- the webhook side: its cancel() closes the connection too ---------------------------------------
def test_a_cancelled_webhook_send_stops_writing_its_request():
    """core/http/client.py: a cancelled request aborts its transport, dropping what is
    still buffered, instead of closing it gracefully (which flushes the rest of the request)."""
    from tests.support.receivers import TEST_SIGNING_SECRET

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    cancelled = threading.Event()
    received = []

    def slow_reader() -> None:  # accepts, reads nothing until the send is cancelled, then everything
        conn, _ = listener.accept()
        cancelled.wait(10)
        total = 0
        conn.settimeout(5)
        try:
            while chunk := conn.recv(1 << 20):
                total += len(chunk)
        except OSError:
            pass
        received.append(total)
        conn.close()

    reader = threading.Thread(target=slow_reader, daemon=True)
    reader.start()
    body = "x" * (32 << 20)  # far more than the kernel's buffers hold: the rest waits in the transport's

    async def scenario() -> list:
        secrets = {"signing_secret": TEST_SIGNING_SECRET}
        prov = build_provider("webhook", {"url": f"http://127.0.0.1:{port}/hook"}, secrets)
        results: list = []
        msg = message()
        msg.body = body
        handle = prov.start_send(msg, results.append)
        await asyncio.sleep(0.3)  # connected; the kernel's buffers are full
        handle.cancel()
        cancelled.set()
        await asyncio.sleep(0.5)  # a graceful close would flush the rest now
        await prov.aclose()
        return results

    try:
        assert asyncio.run(scenario()) == []
        reader.join(10)
    finally:
        listener.close()
    assert received and received[0] < len(body) // 2, received
