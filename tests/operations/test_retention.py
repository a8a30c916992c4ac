"""Retention (`operations.retention`, run by `manage.py prune`): what goes and what stays, counters
that stay monotonic, bad input, and 200,000 rows removed in 200 short batches while a real dispatcher
drains beside it."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from core.models import AuditEvent, Tenant
from dlq.models import DeadLetter
from notifications import counters
from notifications.models import DeliveryAttempt, IdempotencyRecord, Notification
from operations import retention
from operations.retention import PRUNE_ACTION, HistoryPlan, Pruner
from queueing import queue
from queueing.models import QueueItem, ScheduledJob
from tests import factories
from tests.core.conftest import REPO, run_manage
from tests.ops.test_metrics import metric_value
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

EMAIL = "jane.doe@example.com"


def build(tenant: Tenant) -> dict[str, set]:
    """One row of every kind prune must delete or keep; returns the ids that must remain."""
    hook = factories.provider(tenant, "hook")
    old = timezone.now() - timedelta(days=40)

    def note(status: str, *, age=old, changed=None, attempts: int = 1) -> Notification:
        n = factories.notifications(tenant, hook, 1, status=status, recipient=EMAIL)[0]
        tried = changed or age  # attempts finish before the notification last changed
        made = DeliveryAttempt.objects.bulk_create(
            DeliveryAttempt(tenant=tenant, notification=n, number=i, provider=hook, started_at=tried, finished_at=tried,
                            outcome="delivered" if status == "delivered" and i == attempts else "transient_error")
            for i in range(1, attempts + 1)
        )  # fmt: skip
        counters.add(counters.increments([(a.provider_id, a.outcome) for a in made], []))  # as the record does
        Notification.objects.filter(pk=n.pk).update(created_at=age, updated_at=changed or age)
        return n

    def dead_letter(n: Notification, status: str) -> DeadLetter:
        return DeadLetter.objects.create(tenant=tenant, notification=n, provider=hook, failure_class="permanent",
                                         failure_reason="410", attempt_count=1, status=status)

    def job(n: Notification, status: str, *, executed_at=old, made=old) -> ScheduledJob:
        j = ScheduledJob.objects.create(tenant=tenant, notification_id=n.pk, run_at=old, status=status,
                                        executed_at=executed_at if status == "executed" else None)
        ScheduledJob.objects.filter(pk=j.pk).update(created_at=made)
        return j

    gone = [note("delivered", attempts=2) for _ in range(3)]
    gone += [note("cancelled"), note("failed"), note("dead_lettered")]
    job(gone[0], "executed")
    # too recent to go on its own: it goes with its notification (no foreign key would take it along)
    job(gone[3], "cancelled", made=timezone.now())
    dead_letter(gone[4], "discarded")
    dead_letter(gone[5], "redriven")

    kept = {
        "recent": note("delivered", age=timezone.now() - timedelta(days=29)),
        "finished_yesterday": note("delivered", changed=timezone.now() - timedelta(days=1)),
        "open_dlq": note("dead_lettered"),
        "queued": note("queued"),
        "retrying": note("retrying"),
        "dispatching": note("dispatching"),
        "scheduled": note("scheduled"),
        "finished_but_still_queued": note("delivered"),
    }
    dead_letter(kept["open_dlq"], "open")
    for name in ("queued", "finished_but_still_queued"):
        n = kept[name]
        queue.enqueue([queue.NewItem(notification_id=n.pk, tenant_id=tenant.pk, provider_id=hook.pk)])
    done_job = job(kept["queued"], "executed")  # its notification is live, the job itself is done: goes
    pending_job = job(kept["scheduled"], "pending")
    now = timezone.now()
    records = IdempotencyRecord.objects
    expired = records.create(tenant=tenant, key="old", fingerprint="f", expires_at=now - timedelta(hours=1))
    fresh = records.create(tenant=tenant, key="new", fingerprint="f", expires_at=now + timedelta(hours=1))
    AuditEvent.record(actor="user:test", action="test.event", target=gone[0], details={"recipient": EMAIL})
    return {
        "gone": {n.pk for n in gone},
        "kept": {n.pk for n in kept.values()},
        # history goes by age: only these kept notifications' attempts are younger than 30 days
        "kept_recent_attempts": {kept["recent"].pk, kept["finished_yesterday"].pk},
        "gone_jobs": {done_job.pk},
        "kept_jobs": {pending_job.pk},
        "gone_idempotency": {expired.pk},
        "kept_idempotency": {fresh.pk},
    }


def check(ids: dict[str, set], *, history_by_age: bool = False) -> None:
    """`history_by_age`: the history pass ran, and attempts past the cutoff went whatever their
    notification (core.partitions); without it they went with their notification."""
    remaining = set(Notification.objects.values_list("pk", flat=True))
    assert remaining == ids["kept"]
    assert not DeliveryAttempt.objects.filter(notification_id__in=ids["gone"]).exists()
    with_attempts = set(DeliveryAttempt.objects.values_list("notification_id", flat=True))
    assert with_attempts == (ids["kept_recent_attempts"] if history_by_age else ids["kept"])
    assert list(DeadLetter.objects.values_list("status", flat=True)) == ["open"]
    assert set(ScheduledJob.objects.values_list("pk", flat=True)) == ids["kept_jobs"]
    assert set(IdempotencyRecord.objects.values_list("pk", flat=True)) == ids["kept_idempotency"]
    assert QueueItem.objects.count() == 2
    assert AuditEvent.objects.filter(action="test.event").count() == 1, "the audit log is never pruned"


def prune(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("prune", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


# --- what goes, what stays ---------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("history", ["by_age", "none"])
def test_prune_deletes_only_finished_rows_past_retention(tenant_a, history, monkeypatch):
    if history == "none":  # the history pass finds nothing to do: the notification batches take the attempts
        monkeypatch.setattr(Pruner, "history_plan", lambda self: HistoryPlan([], []))
    ids = build(tenant_a)
    before = Client().get("/metrics").content.decode()

    out, err = prune("--older-than", "30", "--batch-size", "2")

    by_age = history == "by_age"
    check(ids, history_by_age=by_age)
    # By age: the 15 attempts older than 30 days sit in the default partition (the test database has
    # day partitions from today on), so the history pass deletes them in batches, before the
    # notifications go. Without it, the 9 of the pruned notifications go with them, in their batches.
    attempts = 0 if by_age else 9
    assert f"pruned 6 notification(s) with {attempts} attempt(s), 2 closed dead letter(s) and 3 scheduled job(s)" in out
    assert "1 expired idempotency record(s)" in out
    history = 15 if by_age else 0
    assert f"dropped 0 history partition(s) (~0 row(s)) and deleted {history} older history row(s)" in out
    assert "notifications: 100%" in err and "6/6" in err, err  # the progress bar, on stderr
    # Each batch is in the audit log; the counters are not derived from attempts, so they did not go down.
    events = AuditEvent.objects.filter(action=PRUNE_ACTION, tenant__isnull=True)
    assert sum(e.details["notifications"] for e in events) == 6 and events.count() >= 3
    after = Client().get("/metrics").content.decode()
    for outcome in ("delivered", "transient_error"):
        name = "omnipost_delivery_attempts_total"
        assert metric_value(after, name, outcome=outcome) == metric_value(before, name, outcome=outcome) > 0

    out, _ = prune("--older-than", "30")  # idempotent
    assert out.startswith("pruned 0 notification(s)")
    check(ids, history_by_age=by_age)


@pytest.mark.django_db
def test_dry_run_counts_and_deletes_nothing(tenant_a):
    build(tenant_a)
    out, _ = prune("--older-than", "30", "--dry-run")
    assert out.strip() == (
        "dry run: would delete 6 finished notification(s) older than 30 day(s) with 9 attempt(s), "
        "1 other done scheduled job(s) and 1 expired idempotency record(s)\n"
        "dry run: would drop 0 history partition(s)\n"
        "dry run: would delete 15 older history row(s) beside newer ones"
    )
    assert Notification.objects.count() == 14
    out, _ = prune("--older-than", "50", "--dry-run")
    assert "would delete 0 finished" in out


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "soon"], "--older-than must be a number of days, got 'soon'"),
        (["--older-than", "-1"], "--older-than must be zero or more days"),
        (["--older-than", "nan"], "--older-than must be zero or more days"),
        (["--batch-size", "0"], "--batch-size must be between 1 and 100,000"),
        (["--batch-size", "1e9"], "--batch-size must be a whole number"),
        (["--batch-size", "1000000"], "--batch-size must be between 1 and 100,000"),
    ],
)
def test_bad_input_is_one_readable_line(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        prune(*args)


def test_bad_input_exits_non_zero_with_one_line(subprocess_env):
    result = run_manage("prune", "--older-than", "yesterday", env=subprocess_env)
    assert result.returncode == 1
    assert result.stderr.strip() == "CommandError: --older-than must be a number of days, got 'yesterday'"


# --- the service, without the command ----------------------------------------------------------------


@pytest.mark.django_db
def test_the_service_counts_then_prunes_what_it_counted(tenant_a):
    ids = build(tenant_a)
    would = retention.dry_run(Pruner(older_than_days=30, batch_size=2))
    assert (would.notifications, would.attempts, would.jobs, would.idempotency) == (6, 9, 1, 1)
    assert set(Notification.objects.values_list("pk", flat=True)) == ids["gone"] | ids["kept"]  # nothing went

    seen: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def progress(total: int, desc: str):  # noqa: ANN202
        seen.append((desc, total))

        class Bar:
            def update(self, n: int) -> None:
                seen.append((desc, n))

        yield Bar()

    totals = retention.prune(Pruner(older_than_days=30, batch_size=2), progress=progress)
    check(ids, history_by_age=True)
    assert (totals.notifications, totals.attempts, totals.dead_letters, totals.jobs, totals.idempotency) == (
        6, 0, 2, 3, 1,
    )  # fmt: skip
    assert (totals.partitions_dropped, totals.history_rows) == (0, 15)
    assert not totals.interrupted
    # the history partitions first: the two tables' default partitions (both trimmed), today's of each
    # holds nothing older than the cutoff
    assert seen[0] == ("history partitions", 2) and seen[1:3] == [("history partitions", 1)] * 2
    assert seen[3] == ("notifications", 6) and seen[4:7] == [("notifications", 2)] * 3


@pytest.mark.django_db
def test_a_stop_set_before_the_run_prunes_nothing_and_says_interrupted(tenant_a):
    ids = build(tenant_a)
    stop = threading.Event()
    stop.set()
    totals = retention.prune(Pruner(older_than_days=30, batch_size=2), stop=stop)
    assert totals.interrupted and totals.notifications == totals.batches == 0
    assert set(Notification.objects.values_list("pk", flat=True)) == ids["gone"] | ids["kept"]
    assert not AuditEvent.objects.filter(action=PRUNE_ACTION).exists()


# --- 200,000 rows in 200 batches beside a draining dispatcher ---------------------------------------------------


OLD = 200_000
BATCH = 500  # 400 batches: prune's work per batch is bounded, not the table; and it outlasts the drain
LIVE = 500  # with the dispatcher's start-up, well inside the prune


def insert_finished(tenant: Tenant, provider_id: int, count: int) -> None:
    """`count` delivered notifications finished 40 days ago, one attempt each, in two INSERT … SELECTs.

    Ids ascend (a random prefix, then a counter) so the load appends to the primary key instead of
    splitting pages at random: twice as fast to insert; prune's work per row is the same."""
    token = Notification._meta.get_field("recipient").get_prep_value(EMAIL)
    with transaction.atomic(), connection.cursor() as cursor:
        # Test data only: skip the per-row foreign-key triggers (every referenced row exists) for speed.
        cursor.execute("SET LOCAL session_replication_role = replica")
        # The anti-join below must hash: with stale statistics (autovacuum is off here) the planner may
        # pick a nested loop over every attempt per row, which never finishes.
        cursor.execute("SET LOCAL enable_nestloop = off")
        cursor.execute(
            """
            INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
                subject, body, priority, queue, status, metadata, attempt_count, attempt_offset, last_error_code,
                created_at, updated_at, enqueued_at, delivered_at)
            SELECT (%s || lpad(to_hex(g), 20, '0'))::uuid, %s, 'webhook', %s, 'j***@example.com', %s, '{}', 's',
                   'b', 5, 'default', 'delivered', '{}', 1, 0, '', t, t, t, t
            FROM (SELECT g, now() - interval '40 days' + g * interval '1 millisecond' AS t
                  FROM generate_series(1, %s) AS g) AS s
            """,
            [uuid.uuid4().hex[:12], tenant.pk, token, provider_id, count],
        )
        cursor.execute(
            """
            INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at, finished_at,
                outcome, error_class, error_code, error_message, http_status, duration_ms)
            SELECT tenant_id, id, 1, provider_id, updated_at, updated_at, 'delivered', '', '', '', 200, 3
            FROM notifications n WHERE status = 'delivered' AND tenant_id = %s
              AND NOT EXISTS (SELECT 1 FROM delivery_attempts a WHERE a.notification_id = n.id)
            """,
            [tenant.pk],
        )
        cursor.execute("ANALYZE notifications; ANALYZE delivery_attempts")


class ActivityMonitor(threading.Thread):
    """Samples pg_stat_activity every 20 ms: prune's open transactions and any dispatcher lock waits."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.prune_xact = 0.0  # the longest transaction prune was seen in (its counts and every batch)
        self.prune_batches_seen = 0
        self.dispatcher_lock_waits = 0
        self.samples = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.02):
                rows = conn.execute(
                    """
                    SELECT application_name, extract(epoch FROM clock_timestamp() - xact_start)::float8,
                           wait_event_type, query
                    FROM pg_stat_activity
                    WHERE datname = current_database() AND pid <> pg_backend_pid()
                      AND (application_name LIKE 'omnipost-prune-%%' OR application_name = 'omnipost-test-dispatcher')
                    """
                ).fetchall()
                self.samples += 1
                for name, age, wait, query in rows:
                    if name.startswith("omnipost-prune-"):
                        self.prune_xact = max(self.prune_xact, age or 0.0)
                        self.prune_batches_seen += "WITH victims" in query
                    elif wait == "Lock":
                        self.dispatcher_lock_waits += 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_old_rows_go_in_short_batches_while_a_dispatcher_drains(tenant_a, subprocess_env, tmp_path):
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=180, delay_ms=30, record=True) as receiver:
        hook = factories.provider(tenant_a, "hook", config={"url": receiver.url},
                                  secrets={"signing_secret": TEST_SIGNING_SECRET})
        t0 = time.monotonic()
        insert_finished(tenant_a, hook.pk, OLD)
        inserted_in = time.monotonic() - t0
        kept = factories.notifications(tenant_a, hook, 50, status="dead_lettered", recipient=EMAIL)
        DeadLetter.objects.bulk_create(
            DeadLetter(tenant=tenant_a, notification=n, provider=hook, failure_class="transient", failure_reason="503",
                       attempt_count=8) for n in kept
        )  # fmt: skip
        long_ago = timezone.now() - timedelta(days=40)
        Notification.objects.filter(pk__in=[n.pk for n in kept]).update(created_at=long_ago, updated_at=long_ago)
        factories.bulk_queued_sql(tenant_a, hook, LIVE)

        db = settings.DATABASES["default"]
        monitor = ActivityMonitor(
            f"host={db['HOST']} port={db['PORT']} dbname={db['NAME']} user={db['USER']} password={db['PASSWORD']}"
        )
        monitor.start()
        out, err = tmp_path / "prune.out", tmp_path / "prune.err"
        prune_started = time.monotonic()
        with out.open("w") as fo, err.open("w") as fe:
            pruner = subprocess.Popen(  # noqa: S603
                [sys.executable, "manage.py", "prune", "--older-than", "30", "--batch-size", str(BATCH)],
                cwd=REPO, env=subprocess_env, stdout=fo, stderr=fe,
            )
        try:
            # The dispatcher starts once prune is deleting, and has to drain entirely beside it.
            assert wait_until(lambda: monitor.prune_batches_seen > 0 or pruner.poll() is not None, 30)
            assert pruner.poll() is None, err.read_text()[-2000:]
            started = time.monotonic()
            env = {**subprocess_env, "OMNIPOST_APP_NAME": "omnipost-test-dispatcher"}
            dispatcher = start_dispatchers(1, env, "--once", "--concurrency", "10", "--batch-size", "10",
                                           log_dir=tmp_path)
            assert wait_exit(dispatcher, 60) == [0], (tmp_path / "dispatcher0.log").read_text()[-2000:]
            drained_in = time.monotonic() - started
            prune_still_running = pruner.poll() is None
            assert pruner.wait(timeout=80) == 0, err.read_text()[-2000:]
            prune_took = time.monotonic() - prune_started
        finally:
            monitor.stop.set()
            monitor.join(5)
            if pruner.poll() is None:
                pruner.kill()

    delivered = {r.webhook_id for r in receiver.requests if r.status == 200}
    assert len(delivered) == LIVE
    assert Notification.objects.filter(status="delivered").count() == LIVE
    print(f"drained in {drained_in:.1f}s, prune took {prune_took:.1f}s")
    assert prune_still_running, "the dispatcher should have drained while prune was still deleting"
    assert monitor.dispatcher_lock_waits == 0, "the dispatcher never waited for a lock"

    summary = out.read_text()
    match = re.search(r"pruned ([\d,]+) notification\(s\) with ([\d,]+) attempt.*deleted ([\d,]+) older history "
                      r"row.*?(\d+) batch\(es\).*longest batch ([\d.]+)s", summary)
    assert match, summary
    # The attempts (40 days old) sit in the default partition here (the test database has day partitions
    # from today on): the history pass deletes them by age in page batches before the notifications go.
    assert int(match[1].replace(",", "")) == OLD and int(match[3].replace(",", "")) == OLD
    assert int(match[2]) == 0 and int(match[4]) > OLD // BATCH
    # Short against the whole prune (one transaction for everything would be as long as the prune),
    # and relative to it, so that a machine slowed down by other work slows both alike.
    short = max(2.0, prune_took / 5)
    assert float(match[5]) < short, f"longest batch {match[5]}s of a {prune_took:.1f}s prune"
    assert monitor.prune_xact < short, f"a prune transaction lasted {monitor.prune_xact:.2f}s of {prune_took:.1f}s"
    assert monitor.samples > 100
    assert Notification.objects.filter(status="dead_lettered").count() == 50, "open dead letters stay"
    assert Notification.objects.count() == LIVE + 50
    assert DeliveryAttempt.objects.count() == LIVE
    assert "notifications: 100%" in err.read_text()
    print(json.dumps({  # shown with -s: how long each part took
        "inserted_s": round(inserted_in, 1), "drained_s": round(drained_in, 1), "longest_batch_s": float(match[5]),
        "longest_prune_xact_s": round(monitor.prune_xact, 3), "prune_s": round(prune_took, 1),
        "samples": monitor.samples,
    }))  # fmt: skip
