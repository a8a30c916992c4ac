"""Real dispatcher processes against a real loopback receiver: exactly-once, signals, crashes."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from django.db import connection

from benchmarks.runner import release_together
from notifications.models import Notification
from notifications.services import NotificationSpec, create_notifications
from queueing.models import QueueItem, Worker
from tests import factories
from tests.queueing.dispatch_support import (
    ROOT,
    start_dispatchers,
    start_forked_dispatchers,
    wait_exit,
    wait_started,
    wait_until,
)
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = pytest.mark.django_db(transaction=True)


def hook_for(tenant, receiver, name="hook", **extra):
    return factories.provider(tenant, name, config={"url": receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, **extra)


def delivered_ids(receiver: HttpReceiver) -> collections.Counter:
    return collections.Counter(r.webhook_id for r in receiver.requests if 200 <= r.status < 300)


def test_twenty_dispatchers_deliver_one_hundred_exactly_once(tenant_a, subprocess_env):
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120) as receiver:
        notes = factories.queued(tenant_a, hook_for(tenant_a, receiver), 100)
        procs = [start_forked_dispatchers(20, subprocess_env, "--once", "--batch-size", "3", "--concurrency", "5")]
        assert wait_exit(procs, 90) == [0]  # every one of the twenty exited 0
        counts = delivered_ids(receiver)
        assert set(counts) == {str(n.id) for n in notes}
        assert max(counts.values()) == 1
        assert all(r.verified for r in receiver.requests)
    assert Notification.objects.filter(status="delivered").count() == 100
    assert QueueItem.objects.count() == 0
    assert Worker.objects.filter(kind="dispatcher", stopped_at__isnull=False).count() == 20  # twenty processes


@pytest.mark.slow
def test_four_dispatchers_deliver_twenty_thousand_exactly_once(tenant_a, subprocess_env, tmp_path):
    """… and without a single run of the cyclic garbage collector once started (dispatch.gc_tuning):
    the hot path makes no cycles, and the young generation's threshold is above what 100 in flight
    plus a claimed batch of 100 allocate (with Python's default, ≈ 100 collections per process)."""
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=240, record=True) as receiver:
        prov = hook_for(tenant_a, receiver)
        factories.bulk_queued_sql(tenant_a, prov, 20_000)
        procs = []
        for i in range(4):
            stats_file = str(tmp_path / f"stats{i}.json")
            procs += start_dispatchers(
                1, subprocess_env, "--once", "--batch-size", "100", "--concurrency", "100", "--stats-file", stats_file,
                bench=True,
            )
        assert wait_exit(procs, 200) == [0] * 4
        counts = delivered_ids(receiver)
        assert len(counts) == 20_000 and max(counts.values()) == 1
    assert Notification.objects.filter(status="delivered").count() == 20_000
    assert QueueItem.objects.count() == 0
    stats = [json.loads((tmp_path / f"stats{i}.json").read_text()) for i in range(4)]
    assert sum(s["delivered"] for s in stats) == 20_000
    assert [s["gc_collections"] for s in stats] == [0, 0, 0, 0]


def test_sigterm_during_busy_drain_loses_and_duplicates_nothing(tenant_a, subprocess_env, tmp_path):
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120, delay_ms=150) as receiver:
        notes = factories.queued(tenant_a, hook_for(tenant_a, receiver), 600)
        procs = start_dispatchers(2, subprocess_env, "--batch-size", "20", "--concurrency", "40",
                                  "--grace-seconds", "5", log_dir=tmp_path)
        assert wait_started(tmp_path, 2)
        assert wait_until(lambda: len(receiver.requests) >= 100, 30)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert wait_exit(procs, 15) == [0, 0]
        before = len(delivered_ids(receiver))
        assert 100 <= before < 600, "the drain should have been interrupted mid-way"
        assert QueueItem.objects.filter(lock_token__isnull=False).count() == 0, "leases were given back"
        assert not Notification.objects.filter(status="dispatching").exists()
        finish = start_dispatchers(1, subprocess_env, "--once", "--concurrency", "200")
        assert wait_exit(finish, 60) == [0]
        counts = delivered_ids(receiver)
        assert set(counts) == {str(n.id) for n in notes}
        assert max(counts.values()) == 1
    logs = "".join(p.read_text() for p in tmp_path.glob("dispatcher*.log"))
    assert "SIGTERM received" in logs


def test_sigkill_loses_nothing(tenant_a, subprocess_env):
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120, delay_ms=100) as receiver:
        notes = factories.queued(tenant_a, hook_for(tenant_a, receiver), 400)
        procs = start_dispatchers(2, subprocess_env, "--batch-size", "20", "--concurrency", "40",
                                  "--lease-seconds", "1.5")
        assert wait_until(lambda: len(receiver.requests) >= 60, 30)
        for proc in procs:
            proc.kill()
        wait_exit(procs, 10)
        leased_at_kill = QueueItem.objects.filter(lock_token__isnull=False).count()
        assert leased_at_kill > 0
        # The killed workers' leases expire on the database clock; then a peer takes over.
        assert wait_until(lambda: not QueueItem.objects.leased().exists(), 10)
        finish = start_dispatchers(2, subprocess_env, "--once", "--concurrency", "100")
        assert wait_exit(finish, 60) == [0, 0]
        counts = delivered_ids(receiver)
        assert set(counts) == {str(n.id) for n in notes}, "nothing lost"
        # At-least-once only for what was leased (in flight) at the kill: no more duplicates than that.
        assert sum(c - 1 for c in counts.values()) <= leased_at_kill
    assert Notification.objects.filter(status="delivered").count() == 400
    assert QueueItem.objects.count() == 0


def test_a_dispatcher_holds_at_most_two_database_connections(tenant_a, subprocess_env, tmp_path):
    """At most two per dispatcher: one connection for claims and outcomes, one that LISTENs."""

    env = {**subprocess_env, "OMNIPOST_APP_NAME": "omnipost-dispatcher-conn-test"}
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60, delay_ms=50) as receiver:
        factories.queued(tenant_a, hook_for(tenant_a, receiver), 300)
        (proc,) = start_dispatchers(1, env, "--concurrency", "100", "--batch-size", "20", log_dir=tmp_path)
        assert wait_started(tmp_path, 1)
        assert wait_until(lambda: len(receiver.requests) >= 50, 30)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s OR application_name = %s",
                ["omnipost-dispatcher-conn-test", f"omnipost-dispatcher-listen-{socket.gethostname()}-{proc.pid}"],
            )
            held = cursor.fetchone()[0]
        proc.send_signal(signal.SIGTERM)
        assert wait_exit([proc], 20) == [0]
    assert held == 2


def test_idle_dispatchers_are_woken_by_rings_and_claim_on_their_own_connection(tenant_a, subprocess_env, tmp_path):
    """The pickup path: a ring wakes an idle dispatcher's fetch loop, which claims on its DB
    thread; two of them, each notification goes out exactly once and within a poll's time."""

    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60) as receiver:
        hook = hook_for(tenant_a, receiver)
        procs = []
        for i in range(2):
            (tmp_path / f"d{i}").mkdir()
            stats_file = str(tmp_path / f"stats{i}.json")
            procs += start_dispatchers(1, subprocess_env, "--stats-file", stats_file, log_dir=tmp_path / f"d{i}",
                                       bench=True)  # fmt: skip
        assert all(wait_started(tmp_path / f"d{i}", 1) for i in range(2))
        time.sleep(1.5)  # LISTEN established, fetch loops asleep and backed off
        notes, latencies = [], []
        for i in range(20):
            spec = NotificationSpec(channel="webhook", recipient=f"https://x.test/{i}", provider=hook, body="ping")
            before, started = len(delivered_ids(receiver)), time.monotonic()
            notes += create_notifications(tenant_a, [spec], actor="test")
            assert wait_until(lambda before=before: len(delivered_ids(receiver)) > before, 5, interval=0.005)
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert wait_exit(procs, 20) == [0, 0]
        counts = delivered_ids(receiver)
    assert set(counts) == {str(n.id) for n in notes} and max(counts.values()) == 1
    assert sorted(latencies)[len(latencies) // 2] < 0.15, latencies  # polling alone: up to a second
    stats = [json.loads((tmp_path / f"stats{i}.json").read_text()) for i in range(2)]
    assert sum(s["delivered"] for s in stats) == 20
    assert Notification.objects.filter(status="delivered").count() == 20


def test_dispatchers_behind_a_go_file_start_together(tenant_a, subprocess_env, tmp_path):
    """The benchmark's start gate: started dispatchers claim nothing until the go file exists."""

    go_file = tmp_path / "go"
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120) as receiver:
        notes = factories.queued(tenant_a, hook_for(tenant_a, receiver), 50)
        procs = start_dispatchers(2, subprocess_env, "--once", "--go-file", str(go_file), bench=True)
        assert wait_until(lambda: len(list(tmp_path.glob("go.ready.*"))) == 2, 60)
        assert not wait_until(lambda: receiver.requests, 0.5), "a dispatcher claimed before the go"
        assert [p.poll() for p in procs] == [None, None], "--once must not have exited on an untouched queue"
        assert QueueItem.objects.filter(lock_token__isnull=True).count() == 50
        release_together(procs, go_file)
        assert go_file.exists()
        assert wait_exit(procs, 60) == [0, 0]
        counts = delivered_ids(receiver)
        assert set(counts) == {str(n.id) for n in notes} and max(counts.values()) == 1


def test_release_together_fails_when_a_dispatcher_dies_before_it_is_ready(tmp_path):
    """...and kills the others, which would otherwise wait for the go forever."""

    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])  # noqa: S603
    dead.wait()
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # noqa: S603
    with pytest.raises(RuntimeError, match="exited before it was ready"):
        release_together([waiting, dead], tmp_path / "go")
    assert not (tmp_path / "go").exists()
    assert waiting.poll() == -9


def test_a_dispatcher_waiting_for_the_go_stops_when_its_starter_dies(tenant_a, subprocess_env, tmp_path):
    factories.queued(tenant_a, factories.provider(tenant_a), 5)
    starter = (
        "import os, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-m', 'benchmarks.dispatcher', '--no-jitter', '--once', "
        f"'--go-file', {str(tmp_path / 'go')!r}], cwd={str(ROOT)!r}, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid, flush=True)\n"
        f"while not any(f.startswith('go.ready.') for f in os.listdir({str(tmp_path)!r})):\n"
        "    time.sleep(0.01)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", starter], env=subprocess_env, capture_output=True, text=True,  # noqa: S603
                         timeout=60, check=True)  # fmt: skip
    pid = int(out.stdout.split()[0])

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped

    deadline = time.monotonic() + 30
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not gone():
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the dispatcher kept waiting for a go that could never come")
    assert not (tmp_path / "go").exists()
    assert QueueItem.objects.filter(lock_token__isnull=False).count() == 0
    assert Notification.objects.filter(status="queued").count() == 5, "nothing was claimed or sent"


@pytest.mark.parametrize("how", ["grace period runs out", "second signal"])
def test_a_stopping_dispatcher_gives_back_the_sends_it_cannot_finish(tenant_a, subprocess_env, tmp_path, how):
    """Webhook sends run by callback (no task each): the ones still on the wire or waiting for a
    connection when the grace period ends, or at a second signal, go back to the queue untried
    (no attempt row, the claim refunded) and are delivered by the next dispatcher."""
    from notifications.models import DeliveryAttempt

    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120, delay_ms=2000) as receiver:
        notes = factories.queued(tenant_a, hook_for(tenant_a, receiver), 60)
        grace = "0.5" if how == "grace period runs out" else "60"
        procs = start_dispatchers(1, subprocess_env, "--batch-size", "20", "--concurrency", "40",
                                  "--grace-seconds", grace, log_dir=tmp_path)
        assert wait_started(tmp_path, 1)
        assert wait_until(lambda: len(receiver.requests) >= 20, 30)
        signalled = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        if how == "second signal":
            time.sleep(0.2)
            procs[0].send_signal(signal.SIGTERM)
        assert wait_exit(procs, 15) == [0]
        assert time.monotonic() - signalled < 1.8, "given back before the receiver's first answer"
        on_the_wire = len(receiver.requests)
        assert QueueItem.objects.filter(lock_token__isnull=False).count() == 0, "every lease given back"
        assert set(Notification.objects.values_list("status", flat=True)) == {"queued"}
        assert not DeliveryAttempt.objects.exists()
        assert QueueItem.objects.filter(attempts__gt=0).count() == 0, "untried: the claims refunded"
        receiver.configure(delay_ms=0)
        finish = start_dispatchers(1, subprocess_env, "--once", "--concurrency", "100")
        assert wait_exit(finish, 60) == [0]
        received = collections.Counter(r.webhook_id for r in receiver.requests)
    assert set(received) == {str(n.id) for n in notes}
    assert sum(received.values()) - len(notes) <= on_the_wire, "resent: only what was on the wire"
    assert Notification.objects.filter(status="delivered").count() == 60
    assert DeliveryAttempt.objects.filter(number=1).count() == 60 == DeliveryAttempt.objects.count()
    logs = "".join(p.read_text() for p in tmp_path.glob("dispatcher*.log"))
    assert ("grace period over" if how == "grace period runs out" else "second SIGTERM") in logs
