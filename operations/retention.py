"""Retention: finished notifications, their attempts, done scheduled jobs and expired idempotency
records go in bounded batches that never hold a transaction for long. `manage.py prune` parses its
flags and calls `dry_run` or `prune`; anything else (a scheduled task, a test) calls the same.

What goes (created and last changed more than `--older-than DAYS` ago):
- notifications `delivered`, `failed`, `dead_lettered` or `cancelled` that have no open dead-letter
  entry and no queue item, together with their delivery attempts, closed dead-letter entries and
  scheduled job;
- scheduled jobs `executed` or `cancelled` (run or created before the cutoff) whose notification
  is still around;
- idempotency records past `expires_at` (keys live 24 h; `--older-than` does not apply);
- last, the tables other apps register (core.retention), oldest rows by their own rule: event
  attempts, finished event deliveries and the events no pending delivery needs, receipts'
  de-duplication keys.

Never: live notifications (scheduled, queued, dispatching, retrying), anything with an open DLQ
entry, the audit log (append-only).

History (`delivery_attempts` by day of `finished_at`, `notification_events` by day of
`occurred_at`, core.partitions) goes first, by age: every day partition whose whole range is older
than the cutoff is DROPped (one short transaction each, with a `retention.drop_partition` audit
event); in the partition the cutoff falls in, and in the default partition, the rows older than the
cutoff are deleted in short batches (a range of pages each, TID range scans, so a batch never
re-reads what an earlier one looked at). A DROP needs an ACCESS EXCLUSIVE lock on the parent table
for a few milliseconds: it waits at most `DROP_LOCK_TIMEOUT` for it (so a dispatcher queued behind
it waits no longer than that) and tries again after a pause, up to `DROP_TRIES` times. Live rows
(queue, scheduled jobs, dead letters) are in other tables and never touched by this part.

Each batch is one short transaction. A notification batch is ONE statement of writable CTEs whose
selection takes `FOR UPDATE SKIP LOCKED`, so prune waits for no one and a dispatcher never waits
for prune; batches walk `notif_created_idx` oldest first (keyset on `created_at`), so no batch
re-reads what an earlier one deleted or skipped. Every batch writes a `retention.prune` audit event
with what it removed, in the same transaction. The `/metrics` counters are not derived from
`delivery_attempts` (notifications.counters), so pruning never lowers them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from django.db import OperationalError, connections, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from core import partitions, pooling, retention
from core.models import AuditEvent
from dlq import statements as dlq_statements
from dlq.models import DeadLetter
from notifications import statements
from notifications.models import FINISHED, DeliveryAttempt, IdempotencyRecord, Notification
from queueing import schedule
from queueing.models import QueueItem, ScheduledJob

DEFAULT_DAYS = 30.0
DEFAULT_BATCH = 5000
MAX_BATCH = 100_000
LOCK_TIMEOUT = "2s"  # a batch that would wait longer for a lock fails instead of queueing behind it
PRUNE_ACTION = "retention.prune"  # the audit event each notification batch writes
PRUNE_ACTOR = "system:prune"
DROP_ACTION = "retention.drop_partition"  # the audit event of each dropped partition
# The history tables partitioned by day (core.partitions) and their partition keys.
HISTORY = (("delivery_attempts", "finished_at"), ("notification_events", "occurred_at"))
DROP_LOCK_TIMEOUT = 0.2  # seconds a DROP waits for its lock before it steps back and tries again
DROP_TRIES = 50
ROWS_PER_PAGE = 50  # a trim batch covers batch_size / ROWS_PER_PAGE pages (history rows are ~ 150 bytes)

AttemptCounts = dict[tuple[str, int | None], int]

_BATCH = """
WITH victims AS (
    SELECT n.id FROM notifications n
    WHERE n.created_at < %(cutoff)s {after}
      AND n.status IN ('delivered', 'failed', 'dead_lettered', 'cancelled') AND n.updated_at < %(cutoff)s
      AND NOT EXISTS (SELECT 1 FROM dead_letter_queue d WHERE d.notification_id = n.id AND d.status = 'open')
      AND NOT EXISTS (SELECT 1 FROM queue_state q WHERE q.notification_id = n.id)
    ORDER BY n.created_at
    LIMIT %(n)s
    FOR UPDATE OF n SKIP LOCKED
), ids AS (
    -- = ANY(array): index probes per victim, never a hash join over a whole table
    SELECT ARRAY(SELECT id FROM victims) AS ids
), attempts AS (
    -- finished_at bound: a victim's attempts finished before it was last changed (< cutoff), give or take
    -- a lease and the workers' clocks; on the partitioned table only the partitions up to the cutoff's
    -- next day are probed, not every newer one
    {ATTEMPTS}
), dead AS (
    {DEAD}
), jobs AS (
    {JOBS}
), gone AS (
    {GONE}
)
SELECT 'notifications', NULL::text, NULL::bigint, count(*), max(created_at) FROM gone
UNION ALL SELECT 'dead_letters', NULL, NULL, count(*), NULL FROM dead
UNION ALL SELECT 'jobs', NULL, NULL, count(*), NULL FROM jobs
UNION ALL SELECT 'attempts', outcome, provider_id, count(*), NULL FROM attempts GROUP BY outcome, provider_id
"""
# Each DELETE is its table's owner's (notifications.statements, dlq.statements, queueing.schedule).
_IDS = "(SELECT ids FROM ids)::uuid[]"
_BATCH = (
    _BATCH.replace("{ATTEMPTS}", statements.delete_attempts_sql(_IDS, "%(cutoff)s::timestamptz + interval '1 day'"))
    .replace("{DEAD}", dlq_statements.delete_dead_letters_sql(_IDS))
    .replace("{JOBS}", schedule.delete_jobs_sql(_IDS))
    .replace("{GONE}", statements.delete_notifications_sql(_IDS))
)


@dataclass
class Batch:
    """What one notification batch removed."""

    notifications: int = 0
    dead_letters: int = 0
    jobs: int = 0
    attempts: AttemptCounts = field(default_factory=dict)
    last_created_at: datetime | None = None


@dataclass(frozen=True)
class HistoryPlan:
    """What the history pass does now: partitions to drop (table, partition, estimated rows) and
    partitions that hold rows older than the cutoff beside newer ones (table, key column, partition)."""

    drop: list[tuple[str, partitions.Partition, int]]
    trim: list[tuple[str, str, partitions.Partition]]


@dataclass
class Totals:
    partitions_dropped: int = 0
    partition_rows: int = 0  # estimated (pg_class.reltuples) rows of the dropped partitions
    history_rows: int = 0  # rows older than the cutoff deleted beside newer ones
    notifications: int = 0
    attempts: int = 0
    dead_letters: int = 0
    jobs: int = 0
    idempotency: int = 0
    retained: dict[str, int] = field(default_factory=dict)  # label -> rows, of other apps' tables (core.retention)
    batches: int = 0
    longest_batch: float = 0.0
    interrupted: bool = False  # stopped by a signal before the end: run prune again to finish

    def timed(self, started: float, removed: int) -> None:
        self.batches += 1 if removed else 0
        self.longest_batch = max(self.longest_batch, time.perf_counter() - started)


class Pruner:
    """The retention queries; `prune` below drives them batch by batch."""

    def __init__(self, *, older_than_days: float, batch_size: int, using: str = "default") -> None:
        self.days = older_than_days
        self.batch_size = batch_size
        self.using = using
        self.cutoff = timezone.now() - timedelta(days=older_than_days)

    # --- what is eligible ---------------------------------------------------------------------------
    def notifications(self) -> QuerySet:
        open_dlq = DeadLetter.objects.using(self.using).open().filter(notification=OuterRef("pk"))
        live_item = QueueItem.objects.using(self.using).filter(notification_id=OuterRef("pk"))
        qs = Notification.objects.using(self.using).filter(
            created_at__lt=self.cutoff, updated_at__lt=self.cutoff, status__in=FINISHED
        )
        return qs.filter(~Exists(open_dlq), ~Exists(live_item))

    def jobs(self) -> QuerySet:
        done = (ScheduledJob.Status.EXECUTED, ScheduledJob.Status.CANCELLED)
        old = Q(executed_at__lt=self.cutoff) | Q(executed_at__isnull=True, created_at__lt=self.cutoff)
        return ScheduledJob.objects.using(self.using).filter(old, status__in=done)

    def idempotency(self) -> QuerySet:
        return IdempotencyRecord.objects.using(self.using).filter(expires_at__lt=Now())

    def counts(self, *, attempts: bool = False) -> dict[str, int]:
        """What would go now (attempts only on request: one more pass over the eligible rows)."""
        eligible = self.notifications().values("pk")
        counts = {
            "notifications": eligible.count(),
            "jobs": self.jobs().exclude(notification_id__in=eligible).count(),
            "idempotency": self.idempotency().count(),
        }
        if attempts:
            counts["attempts"] = DeliveryAttempt.objects.using(self.using).filter(notification__in=eligible).count()
        return counts

    def name_connection(self) -> None:
        """Label this process in pg_stat_activity and bound every lock wait (behind a pooler no
        session setting survives the transaction: `batch` bounds each one's waits instead)."""
        if not pooling.pooled():
            with connections[self.using].cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('application_name', %s, false), set_config('lock_timeout', %s, false)",
                    [f"omnipost-prune-{os.getpid()}", LOCK_TIMEOUT],
                )

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One batch's transaction."""
        with transaction.atomic(using=self.using):
            if pooling.pooled():
                with connections[self.using].cursor() as cursor:
                    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [LOCK_TIMEOUT])
            yield

    # --- history partitions ---------------------------------------------------------------------------
    def history_plan(self) -> HistoryPlan:
        partitioned = partitions.partitioned_tables(using=self.using)
        drop, trim = [], []
        for table, column in HISTORY:
            if partitioned.get(table) != column:
                continue
            parts = partitions.partitions(table, using=self.using)
            estimates = self._estimates([p.name for p in parts])
            for part in parts:
                if part.is_default or part.lower < self.cutoff < part.upper:
                    trim.append((table, column, part))
                elif part.upper <= self.cutoff:
                    drop.append((table, part, estimates.get(part.name, 0)))
        return HistoryPlan(drop, trim)

    def _estimates(self, names: list[str]) -> dict[str, int]:
        with connections[self.using].cursor() as cursor:
            cursor.execute("SELECT relname, greatest(reltuples, 0)::bigint FROM pg_class WHERE relname = ANY(%s)",
                           [names])  # fmt: skip
            return dict(cursor.fetchall())

    def trim_count(self, plan: HistoryPlan) -> int:
        """Rows older than the cutoff in the partitions the cutoff shares (for the dry run)."""
        total = 0
        with connections[self.using].cursor() as cursor:
            for _, column, part in plan.trim:
                name, key = partitions.quote(part.name), partitions.quote(column)
                cursor.execute(f"SELECT count(*) FROM ONLY {name} WHERE {key} < %s", [self.cutoff])  # noqa: S608
                total += cursor.fetchone()[0]
        return total

    def drop_partition(self, table: str, part: partitions.Partition, rows: int, *, stop: threading.Event) -> bool:
        """DROP one partition wholly older than the cutoff; False when it was gone already. Waits at
        most DROP_LOCK_TIMEOUT for the parent's lock at a time, so whoever queues behind it (a
        dispatcher's record statement) waits no longer than that plus the drop itself."""
        for attempt in range(1, DROP_TRIES + 1):
            try:
                with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
                    cursor.execute("SELECT set_config('lock_timeout', %s, true), to_regclass(%s) IS NOT NULL",
                                   [f"{int(DROP_LOCK_TIMEOUT * 1000)}ms", part.name])  # fmt: skip
                    if not cursor.fetchone()[1]:
                        return False
                    AuditEvent.record(
                        actor=PRUNE_ACTOR, action=DROP_ACTION, target_type=table,
                        details={"older_than_days": self.days, "partition": part.name, "rows_estimated": rows,
                                 "from": part.lower.isoformat(), "to": part.upper.isoformat()},
                    )  # fmt: skip
                    cursor.execute(f"DROP TABLE {partitions.quote(part.name)}")
                return True
            except OperationalError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != "55P03" or attempt == DROP_TRIES:  # lock_not_available
                    raise
                if stop.wait(min(2.0, 0.05 * attempt)):
                    return False
        return False

    def trim_batches(self, column: str, part: partitions.Partition) -> Iterator[int]:
        """Delete the rows older than the cutoff from one partition, a range of pages per transaction;
        yields the rows each batch removed."""
        return self._page_batches(part.name, f"{partitions.quote(column)} < %(cutoff)s")

    def retained_batches(self, table: retention.RetainedTable) -> Iterator[int]:
        """Delete the rows past retention of a table another app registered (core.retention), a batch
        per transaction; yields the rows each batch removed."""
        return self._page_batches(table.table, table.condition)

    def retained_count(self, table: retention.RetainedTable) -> int:
        name = connections[self.using].ops.quote_name(table.table)
        with connections[self.using].cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {name} WHERE {table.condition}", {"cutoff": self.cutoff})  # noqa: S608
            return cursor.fetchone()[0]

    def _page_batches(self, table: str, condition: str) -> Iterator[int]:
        """DELETE the rows of `table` (not its partitions) that `condition` selects, a range
        of batch_size / ROWS_PER_PAGE pages per transaction (a TID range scan each)."""
        step = max(1, self.batch_size // ROWS_PER_PAGE)
        name = partitions.quote(table)  # identifiers from the catalog or a registering app's constants
        with connections[self.using].cursor() as cursor:
            cursor.execute("SELECT pg_relation_size(%s) / current_setting('block_size')::bigint", [table])
            pages = cursor.fetchone()[0]
        for start in range(0, pages, step):
            with self.batch(), connections[self.using].cursor() as cursor:
                cursor.execute(
                    retention.page_delete_sql(name, condition),
                    {"lo": f"({start},0)", "hi": f"({start + step},0)", "cutoff": self.cutoff},
                )
                yield cursor.rowcount

    # --- one batch each -------------------------------------------------------------------------------
    def notification_batch(self, after: datetime | None) -> Batch:
        with self.batch():
            batch = self._batch(after)
            if batch.notifications:
                AuditEvent.record(
                    actor=PRUNE_ACTOR,
                    action=PRUNE_ACTION,
                    target_type="notifications",
                    details={
                        "older_than_days": self.days,
                        "notifications": batch.notifications,
                        "dead_letters": batch.dead_letters,
                        "scheduled_jobs": batch.jobs,
                        # [outcome, provider id, count] of the attempts removed, for the audit trail.
                        "attempts": [[o, p, n] for (o, p), n in sorted(batch.attempts.items(), key=str)],
                    },
                )
        return batch

    def _batch(self, after: datetime | None) -> Batch:
        sql = _BATCH.format(after="AND n.created_at >= %(after)s" if after is not None else "")
        params = {"cutoff": self.cutoff, "after": after, "n": self.batch_size}
        batch = Batch()
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            for kind, outcome, provider_id, n, last in cursor.fetchall():
                if kind == "notifications":
                    batch.notifications, batch.last_created_at = n, last
                elif kind == "dead_letters":
                    batch.dead_letters = n
                elif kind == "jobs":
                    batch.jobs = n
                else:
                    batch.attempts[(outcome, provider_id)] = n
        return batch

    def job_batch(self) -> int:
        with self.batch():
            ids = list(self.jobs().values_list("pk", flat=True)[: self.batch_size])
            return ScheduledJob.objects.using(self.using).filter(pk__in=ids).delete()[0] if ids else 0

    def idempotency_batch(self) -> int:
        with self.batch():
            ids = list(self.idempotency().values_list("pk", flat=True)[: self.batch_size])
            return IdempotencyRecord.objects.using(self.using).filter(pk__in=ids).delete()[0] if ids else 0


class Progress(Protocol):
    def update(self, n: int) -> object: ...


# A progress display for `total` rows of one kind (`desc`), used as a context manager; the command
# hands in tqdm, anything else may show nothing.
ProgressFactory = Callable[[int, str], contextlib.AbstractContextManager[Progress]]


@contextlib.contextmanager
def no_progress(total: int, desc: str) -> Iterator[Progress]:
    class _Silent:
        def update(self, n: int) -> None:
            pass

    yield _Silent()


@dataclass(frozen=True)
class DryRun:
    """What a prune would remove now."""

    days: float
    notifications: int
    attempts: int
    jobs: int
    idempotency: int
    partitions: list[tuple[str, int]] = field(default_factory=list)  # (partition, estimated rows) to drop
    history_rows: int = 0  # rows older than the cutoff that share a partition with newer ones
    retained: list[tuple[str, int]] = field(default_factory=list)  # (label, rows) of other apps' tables


def dry_run(pruner: Pruner) -> DryRun:
    """Count what would go, deleting nothing."""
    pruner.name_connection()
    plan = pruner.history_plan()
    counts = pruner.counts(attempts=True)
    return DryRun(
        pruner.days, counts["notifications"], counts["attempts"], counts["jobs"], counts["idempotency"],
        partitions=[(part.name, rows) for _, part, rows in plan.drop], history_rows=pruner.trim_count(plan),
        retained=[(table.label, pruner.retained_count(table)) for table in retention.TABLES],
    )  # fmt: skip


def prune_history(pruner: Pruner, totals: Totals, *, stop: threading.Event, progress: ProgressFactory) -> None:
    """Drop the history partitions wholly past the cutoff, then trim the ones it falls in."""
    plan = pruner.history_plan()
    if not plan.drop and not plan.trim:
        return
    with progress(len(plan.drop) + len(plan.trim), "history partitions") as bar:
        for table, part, rows in plan.drop:
            if stop.is_set():
                return
            t0 = time.perf_counter()
            if pruner.drop_partition(table, part, rows, stop=stop):
                totals.partitions_dropped += 1
                totals.partition_rows += rows
            totals.timed(t0, 1)
            bar.update(1)
        for _, column, part in plan.trim:
            totals.history_rows += _run_batches(pruner.trim_batches(column, part), totals, stop)
            if stop.is_set():
                return
            bar.update(1)


def _run_batches(batches: Iterator[int], totals: Totals, stop: threading.Event, bar: Progress | None = None) -> int:
    """Run `batches` (each yields the rows it removed, its transaction committed), timing each, until
    they end or `stop` is set; returns the rows removed."""
    removed = 0
    t0 = time.perf_counter()
    for n in batches:
        totals.timed(t0, n)
        removed += n
        if bar is not None:
            bar.update(n)
        if stop.is_set():
            break
        t0 = time.perf_counter()
    return removed


def prune(
    pruner: Pruner, *, stop: threading.Event | None = None, progress: ProgressFactory = no_progress
) -> Totals:
    """Remove everything past retention, batch by batch (history partitions first, then the oldest
    notifications, then done jobs, then expired idempotency records), each batch its own short
    transaction. `stop` (set by a signal) ends the run after the current batch; what was committed
    stays committed. A lost session raises `OperationalError` with the earlier batches committed:
    running again finishes."""
    stop = stop or threading.Event()
    pruner.name_connection()
    totals = Totals()
    prune_history(pruner, totals, stop=stop, progress=progress)
    counts = pruner.counts()
    with progress(counts["notifications"], "notifications") as bar:
        after: datetime | None = None
        while not stop.is_set():
            t0 = time.perf_counter()
            batch = pruner.notification_batch(after)
            totals.timed(t0, batch.notifications)
            if not batch.notifications:
                break
            after = batch.last_created_at
            totals.notifications += batch.notifications
            totals.attempts += sum(batch.attempts.values())
            totals.dead_letters += batch.dead_letters
            totals.jobs += batch.jobs
            bar.update(batch.notifications)
    for desc, step, total in (
        ("scheduled jobs", pruner.job_batch, counts["jobs"]),
        ("idempotency", pruner.idempotency_batch, counts["idempotency"]),
    ):
        with progress(total, desc) as bar:
            while not stop.is_set():
                t0 = time.perf_counter()
                n = step()
                totals.timed(t0, n)
                if not n:
                    break
                bar.update(n)
                if desc == "scheduled jobs":
                    totals.jobs += n
                else:
                    totals.idempotency += n
    for table in retention.TABLES:
        if stop.is_set():
            break
        with progress(0, table.label) as bar:
            totals.retained[table.label] = _run_batches(pruner.retained_batches(table), totals, stop, bar)
    totals.interrupted = stop.is_set()
    return totals
