"""`prune` on the partitioned history (operations.retention, core.partitions): whole day partitions past
the cutoff are dropped, the partition the cutoff falls in is trimmed in batches, the dry run lists
what it would drop, the notification delete path probes only the partitions it can find rows in, and
all of it while a real dispatcher keeps delivering."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from core import partitions
from core.models import AuditEvent
from notifications.models import Notification
from operations import retention
from operations.retention import _BATCH, DROP_ACTION, Pruner
from tests import factories
from tests.core.conftest import REPO
from tests.operations.test_retention import insert_finished, prune
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

HISTORY = {"delivery_attempts": "finished_at", "notification_events": "occurred_at"}
DAYS = 40


def today():  # noqa: ANN201
    return datetime.now(UTC).date()


def make_history_partitions(days: int = DAYS) -> None:
    for table in HISTORY:
        partitions.ensure(table, start=today() - timedelta(days=days))


def fill_history(rows_a_day: int, days: int = DAYS, tenant_id=None) -> None:  # noqa: ANN001
    """`rows_a_day` attempts and as many receipt events a day over the last `days` days (their
    notifications long gone: history rows refer to them without a constraint)."""
    step = f"{86400 / rows_a_day} seconds"
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at, finished_at,
                outcome, error_class, error_code, error_message, http_status, duration_ms)
            SELECT coalesce(%s, gen_random_uuid()), gen_random_uuid(), 1, NULL, t, t, 'delivered', '', '', '', 200, 3
            FROM generate_series(now() - %s * interval '1 day', now(), %s::interval) AS t
            """,
            [tenant_id, days, step],
        )
        cursor.execute(
            """
            INSERT INTO notification_events (tenant_id, notification_id, provider_id, type, receipt, occurred_at,
                details, created_at)
            SELECT coalesce(%s, gen_random_uuid()), gen_random_uuid(), 0, 'delivered', 'delivered', t, '{}', t
            FROM generate_series(now() - %s * interval '1 day', now(), %s::interval) AS t
            """,
            [tenant_id, days, step],
        )
        for table in HISTORY:
            cursor.execute(f"ANALYZE {table}")


def mid_day_between_rows(days_ago: int) -> float:
    """An age (in days, for `--older-than`) whose cutoff falls between 12:00 and 13:00 UTC `days_ago`
    days back and half an hour from the nearest of `fill_history(rows_a_day=24)`'s hourly rows, at
    whatever time of day the test runs: the day it falls in then holds rows on both sides of it."""
    first_row = count("SELECT mod(extract(epoch FROM now()), 3600)::float8")  # the rows' offset in the hour
    noon = datetime.combine(today() - timedelta(days=days_ago), datetime.min.time(), UTC) + timedelta(hours=12)
    cutoff = noon + timedelta(seconds=(first_row + 1800) % 3600)
    return (timezone.now() - cutoff) / timedelta(days=1)


def children(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = %s::regclass", [table])  # fmt: skip
        return {r[0] for r in cursor.fetchall()}


def count(sql: str, params: list | None = None) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


@pytest.fixture
def standard_partitions() -> Iterator[None]:
    """For tests that commit: afterwards only today's partitions and those ahead (and the default) remain."""
    yield
    for table in HISTORY:
        for part in partitions.partitions(table):
            if not part.is_default and part.upper <= partitions.day_start(today()):
                with connection.cursor() as cursor:
                    cursor.execute(f"DROP TABLE {partitions.quote(part.name)}")


@pytest.mark.django_db
def test_prune_drops_the_whole_days_past_the_cutoff_and_trims_the_day_it_falls_in():
    make_history_partitions()
    fill_history(rows_a_day=24)
    before = {table: partitions.partitions(table) for table in HISTORY}
    older_than = mid_day_between_rows(days_ago=30)
    pruner = Pruner(older_than_days=older_than, batch_size=10)
    cutoff = pruner.cutoff
    doomed = {t: {p.name for p in parts if not p.is_default and p.upper <= cutoff} for t, parts in before.items()}
    boundary = {t: next(p.name for p in parts if not p.is_default and p.lower < cutoff < p.upper)
                for t, parts in before.items()}  # fmt: skip
    # the day the cutoff falls in holds rows on both sides of it
    older = {t: count(f"SELECT count(*) FROM {boundary[t]} WHERE {c} < %s", [cutoff]) for t, c in HISTORY.items()}
    younger = {t: count(f"SELECT count(*) FROM {t} WHERE {c} >= %s", [cutoff]) for t, c in HISTORY.items()}
    assert all(older.values()) and all(count(f"SELECT count(*) FROM {boundary[t]}") > older[t] for t in HISTORY)
    # days -40 … -31, the last day wholly before the cutoff
    whole_days = sum(1 for d in range(DAYS, 0, -1) if partitions.day_start(today() - timedelta(days=d - 1)) <= cutoff)
    assert whole_days == 10
    assert {len(d) for d in doomed.values()} == {whole_days}

    out, err = prune("--older-than", repr(older_than), "--batch-size", "10")

    for table, column in HISTORY.items():
        left = children(table)
        assert left == {p.name for p in before[table]} - doomed[table], "exactly the whole old days went"
        assert boundary[table] in left
        assert count(f"SELECT count(*) FROM {table} WHERE {column} < %s", [cutoff]) == 0
        assert count(f"SELECT count(*) FROM {table}") == younger[table], "nothing newer than the cutoff went"
    assert f"dropped {2 * whole_days} history partition(s)" in out
    assert f"deleted {sum(older.values())} older history row(s) beside newer ones" in out
    assert "history partitions: 100%" in err
    dropped = AuditEvent.objects.filter(action=DROP_ACTION)
    assert {e.details["partition"] for e in dropped} == doomed["delivery_attempts"] | doomed["notification_events"]


@pytest.mark.django_db
def test_dry_run_lists_the_partitions_it_would_drop_and_changes_nothing():
    make_history_partitions()
    fill_history(rows_a_day=4)
    before = {table: children(table) for table in HISTORY}
    rows = {table: count(f"SELECT count(*) FROM {table}") for table in HISTORY}

    out, _ = prune("--older-than", "35", "--dry-run")

    named = re.findall(r"^  (\w+) \(~([\d,]+) row\(s\)\)$", out, re.M)
    expected = {partitions.day_name(t, today() - timedelta(days=d)) for t in HISTORY for d in range(36, DAYS + 1)}
    assert {name for name, _ in named} == expected
    assert all(int(n) == 4 for name, n in named if not name.endswith(f"{today() - timedelta(days=DAYS):%Y%m%d}"))
    assert f"would drop {len(expected)} history partition(s)" in out
    assert {table: children(table) for table in HISTORY} == before
    assert {table: count(f"SELECT count(*) FROM {table}") for table in HISTORY} == rows
    assert not AuditEvent.objects.filter(action=DROP_ACTION).exists()


@pytest.mark.django_db
def test_a_notification_batch_probes_only_the_partitions_its_attempts_can_be_in():
    """Deleting a batch of notifications deletes their attempts by notification id: without the
    partition key every partition's index would be probed for every id."""
    make_history_partitions()
    pruner = Pruner(older_than_days=30, batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + _BATCH.format(after=""), {"cutoff": pruner.cutoff, "n": 5000})
        plan = "\n".join(r[0] for r in cursor.fetchall())
    later = [p for p in partitions.partitions("delivery_attempts")
             if not p.is_default and p.lower >= pruner.cutoff + timedelta(days=1)]  # fmt: skip
    removed = re.search(r"Subplans Removed: (\d+)", plan)
    assert removed and int(removed[1]) == len(later) >= 29, plan


class LockWaits(threading.Thread):
    """Samples pg_stat_activity every 10 ms: the longest lock wait seen of the dispatcher, and prune's DROPs."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.stop = dsn, threading.Event()
        self.longest_dispatcher_wait = 0.0
        self.drops_seen = self.samples = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.01):
                rows = conn.execute(
                    """
                    SELECT application_name, wait_event_type, query,
                           extract(epoch FROM clock_timestamp() - state_change)::float8
                    FROM pg_stat_activity
                    WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'
                      AND (application_name LIKE 'omnipost-prune-%%' OR application_name = 'omnipost-test-dispatcher')
                    """
                ).fetchall()
                self.samples += 1
                for name, wait, query, age in rows:
                    if name.startswith("omnipost-prune-"):
                        self.drops_seen += query.startswith("DROP TABLE")
                    elif wait == "Lock":
                        self.longest_dispatcher_wait = max(self.longest_dispatcher_wait, age or 0.0)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_prune_drops_partitions_while_a_dispatcher_keeps_delivering(
    tenant_a, subprocess_env, tmp_path, standard_partitions
):  # fmt: skip
    live = 2000
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=180, delay_ms=20, record=True) as receiver:
        hook = factories.provider(tenant_a, "hook", config={"url": receiver.url},
                                  secrets={"signing_secret": TEST_SIGNING_SECRET})  # fmt: skip
        make_history_partitions()
        fill_history(rows_a_day=1000, tenant_id=tenant_a.pk)  # 40,000 attempts and as many events
        insert_finished(tenant_a, hook.pk, 6_000)  # finished 40 days ago, gone in 3 notification batches
        factories.bulk_queued_sql(tenant_a, hook, live)
        db = settings.DATABASES["default"]
        monitor = LockWaits(f"host={db['HOST']} port={db['PORT']} dbname={db['NAME']} user={db['USER']} "
                            f"password={db['PASSWORD']}")  # fmt: skip
        monitor.start()
        env = {**subprocess_env, "OMNIPOST_APP_NAME": "omnipost-test-dispatcher"}
        dispatcher = start_dispatchers(1, env, "--once", "--concurrency", "10", "--batch-size", "10", log_dir=tmp_path)
        try:
            # prune starts once the dispatcher is delivering, and runs beside it
            assert wait_until(lambda: len(receiver.requests) >= 50, 60), (tmp_path / "dispatcher0.log").read_text()
            started = time.monotonic()
            at_prune_start = len(receiver.requests)
            result = subprocess.run(  # noqa: S603
                [sys.executable, "manage.py", "prune", "--older-than", "30", "--batch-size", "2000"],
                cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            prune_s = time.monotonic() - started
            at_prune_end = len(receiver.requests)
            assert result.returncode == 0, result.stderr[-2000:]
            assert wait_exit(dispatcher, 120) == [0], (tmp_path / "dispatcher0.log").read_text()[-2000:]
        finally:
            monitor.stop.set()
            monitor.join(5)
            for proc in dispatcher:
                if proc.poll() is None:
                    proc.kill()

    # every live notification delivered once, the dispatcher having gone on through the drops
    delivered = [r.webhook_id for r in receiver.requests if r.status == 200]
    assert len(delivered) == len(set(delivered)) == live
    assert Notification.objects.filter(status="delivered").count() == live
    # it went on delivering while prune ran (drops included) and finished after it
    assert at_prune_end > at_prune_start and at_prune_end < live, (at_prune_start, at_prune_end)
    # the history: the days wholly past 30 days dropped, nothing else of the dispatcher's touched
    for table in HISTORY:
        assert not [p for p in partitions.partitions(table) if not p.is_default and p.upper <= timezone.now()
                    - timedelta(days=30)]  # fmt: skip
    assert "dropped 20 history partition(s)" in result.stdout, result.stdout
    assert re.search(r"pruned 6,000 notification\(s\)", result.stdout), result.stdout
    assert count("SELECT count(*) FROM delivery_attempts WHERE finished_at > now() - interval '1 hour' "
                 "AND notification_id IN (SELECT id FROM notifications)") == live  # fmt: skip
    assert monitor.samples > 50
    # a dispatcher queued behind prune waits no longer than prune's own lock bound: a DROP steps back
    # after DROP_LOCK_TIMEOUT, a batch fails after LOCK_TIMEOUT rather than holding the queue
    bound = max(retention.DROP_LOCK_TIMEOUT, float(retention.LOCK_TIMEOUT.removesuffix("s")))
    assert monitor.longest_dispatcher_wait < bound, (monitor.longest_dispatcher_wait, bound)
    print(json.dumps({  # shown with -s
        "prune_s": round(prune_s, 2), "delivered_during_prune": at_prune_end - at_prune_start,
        "longest_dispatcher_lock_wait_s": round(monitor.longest_dispatcher_wait, 3), "drops_seen": monitor.drops_seen,
    }))  # fmt: skip

