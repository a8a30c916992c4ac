"""Lost database sessions under load: terminated backends never end a dispatcher, lose a
notification or send one twice."""

from __future__ import annotations

import collections
import signal
import time

import psycopg
import pytest
from django.db import connection

from notifications.models import Notification
from queueing.models import QueueItem, Worker
from tests import factories
from tests.queueing.conftest import restore_schema
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = pytest.mark.django_db(transaction=True)


def _dsn() -> str:
    db = connection.settings_dict
    return f"host={db['HOST']} port={db['PORT']} user={db['USER']} dbname={db['NAME']} application_name=terminator"


def terminate_product_sessions() -> int:
    """What a failover or a pooler's idle timeout does: every OmniPost session of the test database
    ends at once (the other databases on this server are left alone)."""
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE 'omnipost%%' AND datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    connection.close()  # this test's own session may have been among them
    return len(rows)


def delivered_ids(receiver: HttpReceiver) -> collections.Counter:
    return collections.Counter(r.webhook_id for r in receiver.requests if 200 <= r.status < 300)


def hook_for(tenant, receiver):
    return factories.provider(tenant, "hook", config={"url": receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET})


def _dispatcher_env(subprocess_env: dict) -> dict:
    return {**subprocess_env, "OMNIPOST_APP_NAME": "omnipost-dispatcher"}


def test_sessions_terminated_twice_mid_drain_lose_and_repeat_nothing(tenant_a, subprocess_env, tmp_path):
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=150, delay_ms=200) as receiver:
        notes = factories.queued(tenant_a, hook_for(tenant_a, receiver), 600)
        procs = start_dispatchers(2, _dispatcher_env(subprocess_env), "--batch-size", "10", "--concurrency", "10",
                                  log_dir=tmp_path)  # the default 30 s lease
        assert wait_started(tmp_path, 2)
        kills = []
        for threshold in (120, 320):
            assert wait_until(lambda t=threshold: len(receiver.requests) >= t, 60)
            kills.append(terminate_product_sessions())
        assert all(k >= 2 for k in kills), kills  # at least both dispatchers' own sessions each time
        assert wait_until(lambda: Notification.objects.filter(status="delivered").count() == 600, 90)
        assert [p.poll() for p in procs] == [None, None], "a dispatcher exited"
        counts = delivered_ids(receiver)
        assert set(counts) == {str(n.id) for n in notes}
        assert max(counts.values()) == 1, {k: v for k, v in counts.items() if v > 1}
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert wait_exit(procs, 30) == [0, 0]
    assert QueueItem.objects.count() == 0
    logs = "".join(p.read_text() for p in tmp_path.glob("dispatcher*.log"))
    assert "the dispatcher stops" not in logs
    assert "database unavailable" in logs or "could not extend" in logs or "LISTEN connection failed" in logs
    # every dispatcher reported its reconnects in its heartbeat (the registry, and so /metrics)
    assert wait_until(lambda: sum(w.reconnects for w in Worker.objects.all()) >= 2, 5)


def test_sends_longer_than_the_lease_survive_terminated_sessions_and_are_sent_once(
    tenant_a, subprocess_env, tmp_path
):
    """Sends of 6 s under a 2.5 s lease: the lease keeper extends through two terminations, so no
    peer re-claims what is still on the wire."""
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=90, delay_ms=6000) as receiver:
        notes = factories.queued(tenant_a, hook_for(tenant_a, receiver), 20)
        procs = start_dispatchers(2, _dispatcher_env(subprocess_env), "--batch-size", "5", "--concurrency", "10",
                                  "--lease-seconds", "2.5", log_dir=tmp_path)
        assert wait_started(tmp_path, 2)
        assert wait_until(lambda: len(receiver.requests) >= 20, 20)  # all 20 on the wire (recorded on arrival)
        started = time.monotonic()
        # Both terminations fall inside the 6 s sends, and each is longer ago than a lease by the end.
        time.sleep(1.0)
        terminate_product_sessions()
        time.sleep(2.0)
        terminate_product_sessions()
        assert wait_until(lambda: Notification.objects.filter(status="delivered").count() == 20, 40)
        assert time.monotonic() - started > 2.5, "the sends did not outlive their lease"
        assert [p.poll() for p in procs] == [None, None]
        counts = delivered_ids(receiver)
        assert set(counts) == {str(n.id) for n in notes}
        assert len(receiver.requests) == 20, collections.Counter(r.webhook_id for r in receiver.requests)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert wait_exit(procs, 30) == [0, 0]
    assert QueueItem.objects.count() == 0


@pytest.mark.slow
def test_postgresql_restart_mid_drain_loses_nothing_and_every_process_goes_on(subprocess_env, tmp_path,
                                                                              migrated_schema):
    """A private server (initdb + pg_ctl, a free port) restarted under 2 dispatchers and a scheduler:
    all 600 queued and 20 scheduled notifications delivered; no process exits; with a 30 s lease and
    an outage of a few seconds no lease can have expired, so nothing is sent twice."""
    import json
    import subprocess
    import sys

    from tests.queueing.dispatch_support import ROOT
    from tests.support.pgserver import PrivatePostgres

    with PrivatePostgres() as pg, HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=150, delay_ms=100) as receiver:
        env = {**_dispatcher_env(subprocess_env), "DATABASE_URL": pg.create_database("omnipost_restart")}
        restore_schema(migrated_schema, pg.dsn("omnipost_restart"))
        seeded = json.loads(subprocess.run(  # noqa: S603
            [sys.executable, "-m", "tests.queueing.fault_seed", "--url", receiver.url, "--secret", TEST_SIGNING_SECRET,
             "--queued", "600", "--scheduled", "20", "--in", "8"],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=60,
        ).stdout)
        procs = start_dispatchers(2, env, "--batch-size", "10", "--concurrency", "10", log_dir=tmp_path)
        scheduler_log = open(tmp_path / "scheduler.log", "w")  # noqa: SIM115
        scheduler = subprocess.Popen(  # noqa: S603
            [sys.executable, "manage.py", "run_scheduler", "--interval", "0.5"], cwd=ROOT, env=env,
            stdout=scheduler_log, stderr=scheduler_log,
        )
        try:
            assert wait_started(tmp_path, 2)
            assert wait_until(lambda: len(receiver.requests) >= 150, 60)
            down = pg.restart(down_seconds=1.0)
            assert down < 30, "the outage must be shorter than the lease for this test's claim"
            expected = set(seeded["queued"]) | set(seeded["scheduled"])

            def delivered() -> int:
                with psycopg.connect(pg.dsn("omnipost_restart")) as conn:
                    return conn.execute("SELECT count(*) FROM notifications WHERE status = 'delivered'").fetchone()[0]

            assert wait_until(lambda: delivered() == len(expected), 90, interval=0.5)
            assert [p.poll() for p in procs] == [None, None] and scheduler.poll() is None, "a process exited"
            counts = delivered_ids(receiver)
            assert set(counts) == expected
            assert max(counts.values()) == 1
            with psycopg.connect(pg.dsn("omnipost_restart")) as conn:
                assert conn.execute("SELECT count(*) FROM queue_state").fetchone()[0] == 0
                assert conn.execute("SELECT count(*) FROM scheduled_jobs WHERE status = 'pending'").fetchone()[0] == 0
        finally:
            for proc in [*procs, scheduler]:
                proc.send_signal(signal.SIGTERM)
            codes = wait_exit([*procs, scheduler], 30)
            scheduler_log.close()
        assert codes == [0, 0, 0]
    logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "database unavailable" in logs
