"""Failover to a promoted replica: a primary and a synchronous
standby started by the test (`initdb`, `pg_basebackup -R`), every process given the multi-host URL
`postgres://…@primary,standby/db?target_session_attrs=read-write`; the primary is stopped with
`-m immediate` and the standby promoted while the API takes creates and two dispatchers and the
scheduler drain.

Duplicates: every lease is 30 s and the outage (stop to promotion) about 2 s, so no lease can
expire while its holder is cut off; the test checks the outage is shorter than the lease and then
asserts 0 duplicates, not merely "only for expired leases".
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.queueing.conftest import restore_schema
from tests.queueing.dispatch_support import ROOT, start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.pgserver import PrivatePostgres, free_port
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = pytest.mark.slow

GUNICORN = str(Path(sys.executable).with_name("gunicorn"))
DBNAME = "omnipost_failover_cluster"
LEASE_SECONDS = 30.0
CREATE = {"channel": "webhook", "recipient": "https://example.test/hook", "provider": "hook", "subject": "s",
          "body": "b"}  # fmt: skip


@dataclass
class Cluster:
    primary: PrivatePostgres
    standby: PrivatePostgres
    url: str  # both hosts, read-write only
    seed: dict = field(default_factory=dict)

    def scalar(self, server: PrivatePostgres, statement: str) -> object:
        return server.sql(statement, dbname=DBNAME)


@pytest.fixture
def cluster(migrated_schema: str) -> Iterator[Cluster]:
    """A migrated primary (synchronous_commit on) with a synchronous hot standby."""
    with PrivatePostgres(settings={"synchronous_commit": "on", "max_connections": "200"}) as primary:
        primary.create_database(DBNAME)
        restore_schema(migrated_schema, primary.dsn(DBNAME))
        standby = primary.standby(synchronous=True)
        try:
            url = (f"postgres://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/{DBNAME}"
                   "?target_session_attrs=read-write")  # fmt: skip
            yield Cluster(primary, standby, url)
        finally:
            standby.close()


def seed(cluster: Cluster, env: dict[str, str], receiver_url: str, *args: str) -> dict:
    out = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "tests.queueing.fault_seed", "--url", receiver_url, "--secret", TEST_SIGNING_SECRET,
         "--api-key", *args],
        cwd=ROOT, env={**env, "DATABASE_URL": cluster.url}, check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return json.loads(out.stdout)


def undelivered(cluster: Cluster, expected: set[str]) -> list:
    """What became of expected notifications not delivered (for a failure's message)."""
    with psycopg.connect(cluster.standby.dsn(DBNAME)) as conn:
        found = {str(r[0]): r[1:] for r in conn.execute(
            "SELECT n.id, n.status, n.attempt_count, q.lock_token, q.locked_until, q.available_at, q.ready, "
            "q.attempts, now() FROM notifications n LEFT JOIN queue_state q ON q.notification_id = n.id "
            "WHERE n.status <> 'delivered'")}  # fmt: skip
        present = {str(r[0]) for r in conn.execute("SELECT id FROM notifications")}
    return [(i, found[i]) for i in expected if i in found][:10] + [(i, "missing") for i in expected - present][:10]


def web_env(env: dict[str, str], database_url: str) -> dict[str, str]:
    return {**env, "DATABASE_URL": database_url, "DEBUG": "false", "SECRET_KEY": "failover-test-only",
            "ALLOWED_HOSTS": "127.0.0.1", "CONN_MAX_AGE": "60", "OMNIPOST_AUTH_LISTEN": "true",
            "OMNIPOST_RATE_LIMIT_API": "0", "OMNIPOST_APP_NAME": "omnipost-web",
            "OMNIPOST_PUBLIC_URL": "http://127.0.0.1", "OMNIPOST_LOG_LEVEL": "WARNING"}  # fmt: skip


def start_web(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """A real gunicorn on a free loopback port, up once /healthz answers."""
    port = free_port()
    out = open(log, "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(  # noqa: S603
        [GUNICORN, "omnipost_site.wsgi:application", "--workers", "1", "--threads", "4", "--bind",
         f"127.0.0.1:{port}", "--log-level", "warning"], cwd=ROOT, env=env, stdout=out, stderr=out,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    assert wait_until(up, 30), log.read_text()
    return proc, base


def stop(procs: list[subprocess.Popen]) -> list[int]:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    return wait_exit(procs, 30)


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, (response.status_code, response.text)
    assert response.json()["error"]["code"] == "unavailable"
    assert response.headers["Retry-After"] == "1"


class Creator(threading.Thread):
    """A steady stream of single creates; records every acknowledged (201) id and every other answer."""

    def __init__(self, base: str, key: str) -> None:
        super().__init__(daemon=True)
        self.base, self.key = base, key
        self.acked: list[str] = []
        self.answers: collections.Counter = collections.Counter()
        self.odd: list[str] = []  # bodies of answers other than 201 and 503
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {self.key}"}, timeout=20) as client:
            while not self.stopping.is_set():
                try:
                    response = client.post("/api/v1/notifications", json=CREATE)
                except httpx.TransportError as exc:
                    self.answers[type(exc).__name__] += 1
                    self.odd.append(repr(exc))
                    continue
                self.answers[response.status_code] += 1
                if response.status_code not in (201, 503):
                    self.odd.append(response.text[:300])
                if response.status_code == 201:
                    self.acked.append(response.json()["id"])
                elif response.status_code == 503:
                    if response.json()["error"]["code"] != "unavailable" or "Retry-After" not in response.headers:
                        self.answers["503 of another shape"] += 1
                    self.stopping.wait(0.05)
                self.stopping.wait(0.02)


def test_failover_mid_drain_every_process_follows_and_nothing_acknowledged_is_lost(
    cluster: Cluster, subprocess_env: dict[str, str], tmp_path: Path
):
    env = {**subprocess_env, "DATABASE_URL": cluster.url, "OMNIPOST_APP_NAME": "omnipost-dispatcher"}
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=240, delay_ms=50) as receiver:
        seeded = seed(cluster, env, receiver.url, "--queued", "400", "--scheduled", "20", "--in", "12")
        web, base = start_web(web_env(subprocess_env, cluster.url), tmp_path / "web.log")
        procs = start_dispatchers(2, env, "--batch-size", "10", "--concurrency", "10",
                                  "--lease-seconds", str(LEASE_SECONDS), log_dir=tmp_path)  # fmt: skip
        scheduler_log = open(tmp_path / "scheduler.log", "w")  # noqa: SIM115
        scheduler = subprocess.Popen(  # noqa: S603
            [sys.executable, "manage.py", "run_scheduler", "--interval", "0.5"], cwd=ROOT,
            env={**env, "OMNIPOST_APP_NAME": "omnipost-scheduler"}, stdout=scheduler_log, stderr=scheduler_log,
        )  # fmt: skip
        creator = Creator(base, seeded["api_key"])
        everyone = [web, *procs, scheduler]
        try:
            assert wait_started(tmp_path, 2)
            creator.start()
            assert wait_until(lambda: len(receiver.requests) >= 150 and len(creator.acked) >= 30, 60)

            # --- the failover: no primary, then the standby promoted ----------------------------------
            began = time.monotonic()
            cluster.primary.stop("immediate")
            assert_unavailable(httpx.post(f"{base}/api/v1/notifications", json=CREATE, timeout=20,
                                          headers={"Authorization": f"Bearer {seeded['api_key']}"}))  # fmt: skip
            acked_at_stop = len(creator.acked)
            time.sleep(1.5)  # three times the scheduler's interval, so it too meets the outage
            cluster.standby.promote()
            outage = time.monotonic() - began
            assert not cluster.standby.in_recovery()
            assert outage < LEASE_SECONDS / 3, "the outage must be well inside a lease for the 0-duplicates claim"

            # the web process follows: creates are acknowledged again, by the promoted primary
            assert wait_until(lambda: len(creator.acked) >= acked_at_stop + 50, 60), creator.answers
            creator.stopping.set()
            creator.join(30)
            acked = set(creator.acked)
            expected = set(seeded["queued"]) | set(seeded["scheduled"]) | acked

            def drained() -> bool:
                with psycopg.connect(cluster.standby.dsn(DBNAME)) as conn:
                    ids = {str(r[0]) for r in conn.execute("SELECT id FROM notifications WHERE status = 'delivered'")}
                    left = conn.execute("SELECT count(*) FROM notifications WHERE status <> 'delivered'").fetchone()[0]
                return left == 0 and expected <= ids

            # A claim whose commit reached the standby while its answer was lost waits out its lease.
            assert wait_until(drained, LEASE_SECONDS + 90, interval=0.5), undelivered(cluster, expected)
            assert [p.poll() for p in everyone] == [None] * 4, "a process exited"
            counts = collections.Counter(r.webhook_id for r in receiver.requests if 200 <= r.status < 300)
            assert acked <= set(counts), f"acknowledged but never delivered: {sorted(acked - set(counts))[:5]}"
            # Beyond them only creates answered 503 whose commit had reached the standby when the
            # primary died: never acknowledged, yet stored (a client retrying with an Idempotency-Key
            # gets that one back instead of a second).
            assert len(set(counts) - expected) <= creator.answers[503]
            assert max(counts.values()) == 1, {k: v for k, v in counts.items() if v > 1}
            assert cluster.scalar(cluster.standby, "SELECT count(*) FROM queue_state") == 0
            assert cluster.scalar(cluster.standby,
                                  "SELECT count(*) FROM scheduled_jobs WHERE status = 'pending'") == 0  # fmt: skip

            # every worker reconnected (its heartbeat reports it, on the new primary)
            def reconnects(kind: str) -> list[int]:
                with psycopg.connect(cluster.standby.dsn(DBNAME)) as conn:
                    return [r[0] for r in conn.execute(
                        "SELECT reconnects FROM workers WHERE kind = %s AND stopped_at IS NULL", [kind])]

            assert wait_until(lambda: len(reconnects("dispatcher")) == 2 and min(reconnects("dispatcher")) > 0, 20)
            assert wait_until(lambda: len(reconnects("scheduler")) == 1 and min(reconnects("scheduler")) > 0, 20)
            assert set(creator.answers) <= {201, 503}, (creator.answers, creator.odd)  # never a 500
        finally:
            creator.stopping.set()
            codes = stop(everyone)
            scheduler_log.close()
        assert codes[1:] == [0, 0, 0], codes
    logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "the dispatcher stops" not in logs
    assert "database unavailable" in logs


def test_no_primary_is_503_with_retry_after_and_a_promotion_ends_it(
    cluster: Cluster, subprocess_env: dict[str, str], tmp_path: Path
):
    """Both hosts named, the primary down and the standby not yet promoted: every database request
    is 503 `unavailable` with Retry-After (creates, reads, vendors' receipts), nothing stored; a
    process pointed at the standby alone reads but answers writes 503 (SQLSTATE 25006)."""
    seeded = seed(cluster, subprocess_env, "http://127.0.0.1:9/hook")
    standby_url = f"postgres://postgres@127.0.0.1:{cluster.standby.port}/{DBNAME}"
    both, both_base = start_web(web_env(subprocess_env, cluster.url), tmp_path / "both.log")
    alone, alone_base = start_web(web_env(subprocess_env, standby_url), tmp_path / "standby.log")
    auth = {"Authorization": f"Bearer {seeded['api_key']}"}
    try:
        with httpx.Client(base_url=both_base, headers=auth, timeout=20) as client:
            created = client.post("/api/v1/notifications", json=CREATE)
            assert created.status_code == 201, created.text
            ident = created.json()["id"]
            assert client.get(f"/api/v1/notifications/{ident}").status_code == 200

            # a write from the standby-only process: read-only there
            with httpx.Client(base_url=alone_base, headers=auth, timeout=20) as on_standby:
                assert on_standby.get(f"/api/v1/notifications/{ident}").status_code == 200  # replicated
                assert_unavailable(on_standby.post("/api/v1/notifications", json=CREATE))

                cluster.primary.stop("immediate")
                before = cluster.scalar(cluster.standby, "SELECT count(*) FROM notifications")
                assert_unavailable(client.post("/api/v1/notifications", json=CREATE))  # the hot path
                assert_unavailable(client.post("/api/v1/notifications", json=CREATE, headers={"Idempotency-Key": "k1"}))
                assert_unavailable(client.get(f"/api/v1/notifications/{ident}"))
                assert_unavailable(client.get("/api/v1/notifications"))  # DRF's views
                assert_unavailable(httpx.post(f"{both_base}/hooks/providers/{seeded['provider_id']}", content=b"{}",
                                              headers={"Content-Type": "application/json"}))  # receipts' fast path
                assert client.get("/readyz").status_code == 503
                assert cluster.scalar(cluster.standby, "SELECT count(*) FROM notifications") == before

                cluster.standby.promote()
                assert client.post("/api/v1/notifications", json=CREATE).status_code == 201
                assert on_standby.post("/api/v1/notifications", json=CREATE).status_code == 201
                assert client.get(f"/api/v1/notifications/{ident}").status_code == 200
    finally:
        codes = stop([both, alone])
    assert codes == [0, 0]
