"""`manage.py prune`: retention for finished notifications, their attempts, done scheduled jobs and
expired idempotency records, in bounded batches that never hold a transaction for long.

What goes (created and last changed more than `--older-than DAYS` ago):
- notifications `delivered`, `failed`, `dead_lettered` or `cancelled` that have no open dead-letter
  entry and no queue item, together with their delivery attempts, closed dead-letter entries and
  scheduled job;
- scheduled jobs `executed` or `cancelled` (run or created before the cutoff) whose notification
  is still around;
- idempotency records past `expires_at` (keys live 24 h; `--older-than` does not apply).

Never: live notifications (scheduled, queued, dispatching, retrying), anything with an open DLQ
entry, the audit log (append-only).

Each batch is one short transaction. On PostgreSQL a notification batch is ONE statement of
writable CTEs whose selection takes `FOR UPDATE SKIP LOCKED`, so prune waits for no one and a
dispatcher never waits for prune; batches walk `notif_created_idx` oldest first (keyset on
`created_at`), so no batch re-reads what an earlier one deleted or skipped. Every batch
writes a `retention.prune` audit event with what it removed, in the same transaction. The `/metrics`
counters are not derived from `delivery_attempts` (notifications.counters), so pruning never
lowers them.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError, connections, transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone
from tqdm import tqdm

from core.models import AuditEvent
from dlq.models import DeadLetter
from notifications.models import FINISHED, DeliveryAttempt, IdempotencyRecord, Notification
from omnipost_site.ops.metrics import PRUNE_ACTION, PRUNE_ACTOR
from queueing.models import QueueItem, ScheduledJob

DEFAULT_DAYS = 30.0
DEFAULT_BATCH = 5000
MAX_BATCH = 100_000
LOCK_TIMEOUT = "2s"  # a batch that would wait longer for a lock fails instead of queueing behind it

AttemptCounts = dict[tuple[str, int | None], int]

_BATCH_PG = """
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
    DELETE FROM delivery_attempts WHERE notification_id = ANY((SELECT ids FROM ids)::uuid[])
    RETURNING outcome, provider_id
), dead AS (
    DELETE FROM dead_letter_queue WHERE notification_id = ANY((SELECT ids FROM ids)::uuid[]) RETURNING 1
), jobs AS (
    DELETE FROM scheduled_jobs WHERE notification_id = ANY((SELECT ids FROM ids)::uuid[]) RETURNING 1
), gone AS (
    DELETE FROM notifications WHERE id = ANY((SELECT ids FROM ids)::uuid[]) RETURNING created_at
)
SELECT 'notifications', NULL::text, NULL::bigint, count(*), max(created_at) FROM gone
UNION ALL SELECT 'dead_letters', NULL, NULL, count(*), NULL FROM dead
UNION ALL SELECT 'jobs', NULL, NULL, count(*), NULL FROM jobs
UNION ALL SELECT 'attempts', outcome, provider_id, count(*), NULL FROM attempts GROUP BY outcome, provider_id
"""


@dataclass
class Batch:
    """What one notification batch removed."""

    notifications: int = 0
    dead_letters: int = 0
    jobs: int = 0
    attempts: AttemptCounts = field(default_factory=dict)
    last_created_at: datetime | None = None


@dataclass
class Totals:
    notifications: int = 0
    attempts: int = 0
    dead_letters: int = 0
    jobs: int = 0
    idempotency: int = 0
    batches: int = 0
    longest_batch: float = 0.0

    def timed(self, started: float, removed: int) -> None:
        self.batches += 1 if removed else 0
        self.longest_batch = max(self.longest_batch, time.perf_counter() - started)


class Pruner:
    """The retention queries; `Command` drives them batch by batch."""

    def __init__(self, *, older_than_days: float, batch_size: int, using: str = "default") -> None:
        self.days = older_than_days
        self.batch_size = batch_size
        self.using = using
        self.cutoff = timezone.now() - timedelta(days=older_than_days)

    @property
    def is_pg(self) -> bool:
        return connections[self.using].vendor == "postgresql"

    # --- what is eligible ---------------------------------------------------------------------------
    def notifications(self, after: datetime | None = None) -> QuerySet:
        open_dlq = DeadLetter.objects.using(self.using).open().filter(notification=OuterRef("pk"))
        live_item = QueueItem.objects.using(self.using).filter(notification=OuterRef("pk"))
        qs = Notification.objects.using(self.using).filter(
            created_at__lt=self.cutoff, updated_at__lt=self.cutoff, status__in=FINISHED
        )
        if after is not None:
            qs = qs.filter(created_at__gte=after)
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
            "jobs": self.jobs().exclude(notification__in=eligible).count(),
            "idempotency": self.idempotency().count(),
        }
        if attempts:
            counts["attempts"] = DeliveryAttempt.objects.using(self.using).filter(notification__in=eligible).count()
        return counts

    def name_connection(self) -> None:
        """Label this process in pg_stat_activity and bound every lock wait."""
        if self.is_pg:
            with connections[self.using].cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('application_name', %s, false), set_config('lock_timeout', %s, false)",
                    [f"omnipost-prune-{os.getpid()}", LOCK_TIMEOUT],
                )

    # --- one batch each -------------------------------------------------------------------------------
    def notification_batch(self, after: datetime | None) -> Batch:
        with transaction.atomic(using=self.using):
            batch = self._batch_pg(after) if self.is_pg else self._batch_portable(after)
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

    def _batch_pg(self, after: datetime | None) -> Batch:
        sql = _BATCH_PG.format(after="AND n.created_at >= %(after)s" if after is not None else "")
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

    def _batch_portable(self, after: datetime | None) -> Batch:
        oldest_first = self.notifications(after).order_by("created_at")
        rows = list(oldest_first.values_list("pk", "created_at")[: self.batch_size])
        if not rows:
            return Batch()
        ids = [pk for pk, _ in rows]
        attempts = DeliveryAttempt.objects.using(self.using).filter(notification_id__in=ids)
        counts = {
            (r["outcome"], r["provider_id"]): r["n"]
            for r in attempts.values("outcome", "provider_id").annotate(n=Count("pk")).order_by()
        }
        attempts.delete()
        dead = DeadLetter.objects.using(self.using).filter(notification_id__in=ids).delete()[0]
        jobs = ScheduledJob.objects.using(self.using).filter(notification_id__in=ids).delete()[0]
        gone = Notification.objects.using(self.using).filter(pk__in=ids, status__in=FINISHED).delete()[1]
        return Batch(
            notifications=gone.get(Notification._meta.label, 0), dead_letters=dead, jobs=jobs, attempts=counts,
            last_created_at=max(c for _, c in rows),
        )  # fmt: skip

    def job_batch(self) -> int:
        with transaction.atomic(using=self.using):
            ids = list(self.jobs().values_list("pk", flat=True)[: self.batch_size])
            return ScheduledJob.objects.using(self.using).filter(pk__in=ids).delete()[0] if ids else 0

    def idempotency_batch(self) -> int:
        with transaction.atomic(using=self.using):
            ids = list(self.idempotency().values_list("pk", flat=True)[: self.batch_size])
            return IdempotencyRecord.objects.using(self.using).filter(pk__in=ids).delete()[0] if ids else 0


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise CommandError(f"--older-than must be a number of days, got {value!r}") from None
    if not math.isfinite(days) or days < 0:
        raise CommandError(f"--older-than must be zero or more days, got {value!r}")
    return days


def _batch_size(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise CommandError(f"--batch-size must be a whole number, got {value!r}") from None
    if not 1 <= size <= MAX_BATCH:
        raise CommandError(f"--batch-size must be between 1 and {MAX_BATCH:,}, got {value!r}")
    return size


class Command(BaseCommand):
    help = (
        "Delete finished notifications (with their attempts, closed dead letters and scheduled jobs), done "
        "scheduled jobs and expired idempotency records past retention, in short batches. Live notifications, "
        "open dead letters and the audit log are never touched. Ctrl-C stops after the current batch."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        # Values are checked in handle(), so bad input is one readable line (CommandError).
        parser.add_argument("--older-than", default=str(DEFAULT_DAYS), metavar="DAYS",
                            help=f"retention in days since a notification finished (default {DEFAULT_DAYS:g})")
        parser.add_argument("--batch-size", default=str(DEFAULT_BATCH), metavar="N",
                            help=f"rows per transaction (default {DEFAULT_BATCH:,})")
        parser.add_argument("--dry-run", action="store_true", help="only count what would be deleted")

    def handle(self, *args: Any, **options: Any) -> None:
        pruner = Pruner(older_than_days=_days(options["older_than"]), batch_size=_batch_size(options["batch_size"]))
        pruner.name_connection()
        counts = pruner.counts(attempts=options["dry_run"])
        if options["dry_run"]:
            self.stdout.write(
                f"dry run: would delete {counts['notifications']:,} finished notification(s) older than "
                f"{pruner.days:g} day(s) with {counts['attempts']:,} attempt(s), {counts['jobs']:,} other done "
                f"scheduled job(s) and {counts['idempotency']:,} expired idempotency record(s)"
            )
            return
        stop = threading.Event()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def on_signal(sig: int, frame: FrameType | None) -> None:
            if stop.is_set():
                raise KeyboardInterrupt
            self.stderr.write(f"\n{signal.Signals(sig).name}: stopping after the current batch")
            stop.set()

        for sig in previous:
            signal.signal(sig, on_signal)
        started = time.perf_counter()
        try:
            totals = self._run(pruner, counts, stop)
        except OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CommandError(f"prune stopped: {first}; the batches before are committed, run it again") from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.stdout.write(
            f"pruned {totals.notifications:,} notification(s) with {totals.attempts:,} attempt(s), "
            f"{totals.dead_letters:,} closed dead letter(s) and {totals.jobs:,} scheduled job(s); "
            f"{totals.idempotency:,} expired idempotency record(s); {totals.batches} batch(es) in "
            f"{time.perf_counter() - started:.1f}s, longest batch {totals.longest_batch:.3f}s"
        )
        if stop.is_set():
            raise CommandError("interrupted: run prune again to finish")

    def _bar(self, total: int, desc: str) -> tqdm:
        # Always drawn (also when stderr is a log file), so an operator can see it advance.
        return tqdm(total=total, desc=desc, unit="row", file=self.stderr._out, disable=False)

    def _run(self, pruner: Pruner, counts: dict[str, int], stop: threading.Event) -> Totals:
        totals = Totals()
        with self._bar(counts["notifications"], "notifications") as bar:
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
            with self._bar(total, desc) as bar:
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
        return totals
