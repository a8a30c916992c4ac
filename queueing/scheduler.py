"""The scheduler: promotes due scheduled jobs into the queue, on time, exactly once.

One batch is one transaction with a fixed number of statements whatever its size: the due jobs
are marked executed, what they stand for moves on and gets its queue items, all or nothing, so a
crash can never leave a job executed without its item (or the reverse). That is a single statement
(data-modifying CTEs) whose `FOR UPDATE SKIP LOCKED` hands each due job to exactly one of several
schedulers. The queue knows a job only by an opaque id: the app that schedules jobs registers the
handler that promotes them (`register_promotion`), composing queueing's fragments for
`scheduled_jobs` and `queue_state` with its own (notifications.promotion: `scheduled → queued`).
Without a handler the scheduler refuses to run.

Between batches the scheduler sleeps until the next `run_at` (measured with the database's clock),
capped by `interval`, and a doorbell (LISTEN on `omnipost_schedule`, rung by
`queueing.schedule.add_jobs`) wakes it early when a newly scheduled job is due sooner than the one
it sleeps toward; sleeps are also capped by the heartbeat period. While a backlog exists (a full
batch was promoted) it loops without sleeping. A due job the handler finds no longer live (its
notification cancelled meanwhile) ends `cancelled` and enqueues nothing.

Raw SQL lives here because the ORM cannot express a multi-table CTE with SKIP LOCKED.
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from core import partitions, tracing
from core.db_faults import Backoff, is_connection_lost, reconnects, reset_connection
from queueing import heartbeat
from queueing.janitor import Janitor, vacuum_on_default
from queueing.models import DEFAULT_JOB_KIND, Worker
from queueing.queue import NOTIFY_CHANNEL
from queueing.schedule import SCHEDULE_CHANNEL
from queueing.wakeup import Doorbell

logger = logging.getLogger("omnipost.scheduler")

DEFAULT_BATCH_SIZE = 1000
DEFAULT_INTERVAL = 5.0
DEFAULT_JITTER = 1.0
DEFAULT_HEARTBEAT = 5.0
# Shortest sleep when jobs are due but a peer holds them (SKIP LOCKED skipped them): keeps several
# schedulers from spinning against each other while bounding the extra lag to this.
PEER_BACKOFF = 0.01
# Longest sleep without a doorbell (behind PgBouncer without OMNIPOST_LISTEN_DATABASE_URL):
# nothing wakes the loop for a job scheduled sooner than the one it sleeps toward.
POLL_ALONE_INTERVAL = 1.0
MAX_RECONNECT_BACKOFF = 30.0


@dataclass(frozen=True, slots=True)
class Promotion:
    """What one batch did."""

    promoted: int  # jobs executed, their notifications queued
    cancelled: int  # due jobs whose notification was no longer `scheduled` (cancelled meanwhile)
    queues: tuple[str, ...] = ()
    max_lag: float | None = None  # seconds from run_at to enqueue, worst job of the batch

    @property
    def claimed(self) -> int:
        return self.promoted + self.cancelled

    def plus(self, other: Promotion) -> Promotion:
        """Two kinds' batches as one."""
        lags = [lag for lag in (self.max_lag, other.max_lag) if lag is not None]
        return Promotion(
            promoted=self.promoted + other.promoted,
            cancelled=self.cancelled + other.cancelled,
            queues=tuple(sorted(set(self.queues) | set(other.queues))),
            max_lag=max(lags) if lags else None,
        )


# --- one statement per batch: queueing's fragments, composed by the app that schedules -----------------
# A job carries what it promotes by an opaque id (`notification_id`); the app that schedules jobs
# registers the handler that promotes a batch (`register_promotion`, from its AppConfig.ready, as core's
# API throttle is handed the queue's bucket function). The handler composes ONE statement from these
# fragments and its own:
#   due    - `due_jobs_sql()`: the oldest due jobs, locked; SKIP LOCKED leaves to a peer the jobs it holds.
#   (its own CTEs: lock what the jobs stand for, decide which jobs are `live`, move those along)
#   jobs   - `schedule.settle_jobs_sql(source)`: executed when live, else cancelled.
#   items  - `queue.insert_items_sql(…)`: the queue items of the live ones.
#   then   - `promotion_result_sql()`: the batch's figures, and the dispatchers' doorbell (NOTIFY at
#            commit) with the queues that got items, in the same statement.
# `run_promotion` runs such a statement and reads its figures. Literals ('pending') stay in the SQL so
# the planner matches the partial index scheduled_jobs_due_idx (WHERE status = 'pending', ON run_at).
def due_jobs_sql(kind: str = DEFAULT_JOB_KIND) -> str:
    """`SELECT job_id, notification_id, run_at` of up to %(n)s due pending jobs of `kind`, oldest
    run_at first, locked FOR UPDATE SKIP LOCKED (each due job goes to one scheduler)."""
    return f"""SELECT j.job_id, j.notification_id, j.run_at
    FROM scheduled_jobs j
    WHERE j.status = 'pending' AND j.run_at <= now() AND j.kind = '{_kind(kind)}'
    ORDER BY j.run_at
    LIMIT %(n)s
    FOR UPDATE OF j SKIP LOCKED"""  # noqa: S608 - a checked identifier, kept literal for the planner


def promotion_result_sql(jobs: str = "jobs", items: str = "items") -> str:
    """The end of a promotion: `summary AS (…) SELECT promoted, cancelled, queues, max_lag`, from the
    CTE `jobs` (`schedule.settle_jobs_sql`) and `items` (`insert_items_sql … RETURNING queue_name`), ringing
    the dispatchers' doorbell (%(channel)s) with the queues that got items."""
    return f"""summary AS (
    SELECT (SELECT count(*) FROM {jobs} WHERE status = 'executed') AS promoted,
           (SELECT count(*) FROM {jobs} WHERE status = 'cancelled') AS cancelled,
           (SELECT string_agg(DISTINCT queue_name, ',' ORDER BY queue_name) FROM {items}) AS queues,
           (SELECT extract(epoch FROM max(now() - run_at))::float8 FROM {jobs} WHERE status = 'executed') AS max_lag
)
SELECT s.promoted, s.cancelled, s.queues, s.max_lag
FROM summary s
LEFT JOIN LATERAL (SELECT pg_notify(%(channel)s, s.queues) WHERE s.queues IS NOT NULL) AS rang ON true"""  # noqa: S608


def run_promotion(sql: str, batch_size: int, *, using: str = "default") -> Promotion:
    """Run one promotion statement (ending in `promotion_result_sql`) for up to `batch_size` jobs."""
    # One statement: in autocommit mode it is its own transaction; inside a caller's atomic() it
    # joins that one (and its NOTIFY goes out when the caller commits).
    with connections[using].cursor() as cursor:
        cursor.execute(sql, {"n": batch_size, "channel": NOTIFY_CHANNEL})
        promoted, cancelled, queues, max_lag = cursor.fetchone()
    return Promotion(
        promoted=int(promoted),
        cancelled=int(cancelled),
        queues=tuple(queues.split(",")) if queues else (),
        max_lag=max_lag,
    )


# (batch_size, using) -> what the batch did: one statement, see above.
PromotionHandler = Callable[[int, str], Promotion]
_handler: list[PromotionHandler] = []  # the default kind's (notifications), without which nothing runs
_other_kinds: dict[str, PromotionHandler] = {}  # kind -> handler, run after the default kind's each batch
_KIND = re.compile(r"^[a-z][a-z_]{0,19}$")


def _kind(kind: str) -> str:
    if not _KIND.fullmatch(kind):
        raise ValueError(f"a job kind is 1-20 lowercase letters or underscores, not {kind!r}")
    return kind


def register_promotion(handler: PromotionHandler, *, kind: str = DEFAULT_JOB_KIND) -> None:
    """The app that schedules jobs of `kind` hands the scheduler the function that promotes a batch
    of them (its statements select their jobs with `due_jobs_sql(kind)`)."""
    if _kind(kind) == DEFAULT_JOB_KIND:
        _handler[:] = [handler]
    else:
        _other_kinds[kind] = handler


def promotion_handler() -> PromotionHandler:
    """The registered handler; without one the scheduler refuses to run rather than leave due jobs
    pending (or mark them done) unseen."""
    if not _handler:
        raise ImproperlyConfigured(
            "No handler promotes due scheduled jobs: the app that schedules them must call "
            "queueing.scheduler.register_promotion() in its AppConfig.ready(); is that app in INSTALLED_APPS?"
        )
    return _handler[0]


# The partial index serves min(run_at) over pending jobs; the wait is computed by the database so
# the host's clock never matters.
_NEXT_DUE = """
SELECT min(run_at), extract(epoch FROM min(run_at) - now())::float8
FROM scheduled_jobs WHERE status = 'pending'
"""


def promote_in_steps(kind: str, step: Callable[[str], int | None], budget_seconds: float,
                     using: str = "default") -> Promotion:  # fmt: skip
    """For a kind whose job is worked in many short transactions (a chunk each): one statement when no
    job of `kind` is due (the usual case), else `step(using)` (1: it finished a job, 0: more remain,
    None: nothing due this process may take) until `budget_seconds` have passed, so the scheduler's
    other kinds keep their turns. `promoted` counts the jobs finished."""
    if not any_due(kind, using=using):
        return Promotion(0, 0)
    deadline = time.monotonic() + budget_seconds
    finished = 0
    while time.monotonic() < deadline:
        outcome = step(using)
        if outcome is None:
            break
        finished += outcome
    return Promotion(finished, 0)


_ANY_DUE = "SELECT 1 FROM scheduled_jobs WHERE status = 'pending' AND run_at <= now() AND kind = '{kind}' LIMIT 1"


def any_due(kind: str, *, using: str = "default", takeable: bool = False) -> bool:
    """Whether a pending job of `kind` is due (one statement: a handler's check before its batch, the
    usual answer being no). `takeable`: one this process could take now, not one a peer holds
    (FOR UPDATE SKIP LOCKED; the lock ends with the statement outside a transaction)."""
    sql = _ANY_DUE.format(kind=_kind(kind)) + (" FOR UPDATE SKIP LOCKED" if takeable else "")
    with connections[using].cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone() is not None


def promote_due(batch_size: int, *, using: str = "default") -> Promotion:
    """Promote up to `batch_size` due jobs, oldest run_at first, in one transaction, through the
    registered handler (ImproperlyConfigured without one)."""
    handler = promotion_handler()
    if batch_size <= 0:
        return Promotion(0, 0)
    done = handler(batch_size, using)
    for other in list(_other_kinds.values()):
        done = done.plus(other(batch_size, using))
    return done


def next_due(*, using: str = "default") -> tuple[datetime | None, float | None]:
    """The earliest pending run_at and how many seconds from the database's now() until it
    (negative when already due); (None, None) when nothing is pending."""
    with connections[using].cursor() as cursor:
        cursor.execute(_NEXT_DUE)
        run_at, seconds = cursor.fetchone()
    if run_at is None:
        return None, None
    return run_at, float(seconds)


class Scheduler:
    """Promotes due jobs in a loop; `run_once()` is one batch, testable alone."""

    def __init__(
        self,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        interval: float = DEFAULT_INTERVAL,
        jitter: float = DEFAULT_JITTER,
        heartbeat_interval: float = DEFAULT_HEARTBEAT,
        using: str = "default",
        application_name: str | None = None,
    ) -> None:
        if batch_size <= 0 or interval <= 0:
            raise ValueError("batch_size and interval must be positive")
        self.batch_size = batch_size
        self.interval = interval
        self._longest_sleep = interval  # POLL_ALONE_INTERVAL at most once run() finds no doorbell
        self.jitter = max(0.0, jitter)
        self.heartbeat_interval = heartbeat_interval
        self.using = using
        self.application_name = application_name or f"omnipost-scheduler-{os.getpid()}-{socket.gethostname()}"
        self.last = Promotion(0, 0)
        self.worker: Worker | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        # The run_at the loop currently sleeps toward (database time); None: any ring wakes it.
        self._target: datetime | None = None
        self.promoted_total = 0
        self._unreported = 0
        self._window_promoted = 0
        self._window_max_lag = 0.0
        self._next_beat = 0.0
        self.janitor = Janitor()  # VACUUM of the churning tables, between batches (_maintain)
        self.keep_ahead = partitions.KeepAhead()  # tomorrow's history partitions, before their rows (_maintain)
        self._previous_handlers: dict[int, Any] = {}
        self._previous_name: tuple[str | None] | None = None  # set while run() renames the connection

    # --- one step ---------------------------------------------------------------------------------
    def run_once(self) -> int:
        """Promote one batch; returns how many jobs were promoted (queued)."""
        started = tracing.now() if tracing.ENABLED else 0
        self.last = promote_due(self.batch_size, using=self.using)
        if started and self.last.claimed:  # traces are exported: a span per batch that promoted any
            tracing.span("scheduler.promote", started, tracing.now(), {
                "omnipost.promoted": self.last.promoted, "omnipost.cancelled": self.last.cancelled,
                "omnipost.max_lag_seconds": float(self.last.max_lag or 0.0)})  # fmt: skip
        if self.last.claimed:
            self.promoted_total += self.last.promoted
            self._unreported += self.last.promoted
            self._window_promoted += self.last.promoted
            lag = self.last.max_lag or 0.0
            self._window_max_lag = max(self._window_max_lag, lag)
            # Overdue batches (a scheduler was down, or a backlog) are worth a line each.
            level = logging.INFO if lag >= 1.0 else logging.DEBUG
            logger.log(
                level, "promoted %d, skipped %d cancelled; max lag %.3fs; queues %s",
                self.last.promoted, self.last.cancelled, lag, ",".join(self.last.queues) or "-",
                extra={"count": self.last.promoted},
            )
        return self.last.promoted

    # --- the loop -----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to exit after the current batch (callable from any thread)."""
        self._stop.set()
        self._wake.set()

    def run(self, *, once: bool = False) -> None:
        """Run until stop() or a signal; with `once`, promote everything due now and return."""
        promotion_handler()  # none registered: fail at start, not at the first due job
        self._install_signal_handlers()
        doorbell: Doorbell | None = None
        try:
            self._name_connection()
            if self.jitter and not once:
                # Spreads schedulers started together (a deploy) so they do not poll in lockstep.
                self._stop.wait(random.uniform(0, self.jitter))  # noqa: S311 - not security relevant
            if not once:
                doorbell = Doorbell(
                    self._on_schedule_ring, channel=SCHEDULE_CHANNEL, using=self.using,
                    application_name=f"{self.application_name}-listen"[:63],
                ).start()
                if not doorbell.available:
                    self._longest_sleep = min(self.interval, POLL_ALONE_INTERVAL)
                else:
                    # Listening before the first read, so no job scheduled from now on is missed.
                    deadline = time.monotonic() + 5.0
                    while not doorbell.connected.wait(0.05) and not self._stop.is_set():
                        if time.monotonic() > deadline:
                            logger.warning("LISTEN %s not connected yet; polling meanwhile", SCHEDULE_CHANNEL)
                            break
            logger.info(
                "scheduler ready (batch %d, interval %gs, wake-ups: %s)", self.batch_size, self.interval,
                "LISTEN " + SCHEDULE_CHANNEL if doorbell is not None and doorbell.available else "polling",
            )
            self._loop(once)
        finally:
            if doorbell is not None:
                doorbell.stop()
            self._sign_off()
            self._unname_connection()
            self._restore_signal_handlers()
            logger.info("scheduler stopped; promoted %d in all", self.promoted_total)

    def _loop(self, once: bool) -> None:
        backoff = Backoff(first=0.1, cap=MAX_RECONNECT_BACKOFF)
        while not self._stop.is_set():
            try:
                if self.worker is None:
                    self.worker = heartbeat.register(Worker.Kind.SCHEDULER)
                    self._next_beat = time.monotonic() + self.heartbeat_interval
                done = self._step(once)
                backoff.reset()
                if done:
                    return
            except Exception as exc:
                if not is_connection_lost(exc):
                    raise
                # Nothing is lost: a failed batch rolled back, its jobs are still pending.
                delay = backoff.next()
                logger.warning("database unavailable (%s: %s); reconnecting in %.2fs",
                               type(exc).__name__, str(exc).strip()[:200], delay)
                reset_connection(self.using)
                self._stop.wait(delay)

    def _step(self, once: bool) -> bool:
        """One batch and, unless a backlog remains, one sleep. True when `once` is done."""
        # Clear before reading, so a ring arriving from here on is not lost; with no target any
        # ring wakes the coming wait (the read may not have seen the job that rang).
        self._wake.clear()
        self._target = None
        promoted = self.run_once()
        self._maybe_beat()
        self._maintain()
        if self.last.claimed >= self.batch_size:
            return False  # backlog: next batch right away
        run_at, wait = next_due(using=self.using)
        if once:
            if wait is None or wait > 0:
                return True
            # Due jobs a peer holds are its business; ours are done once nothing new became due.
            return promoted == 0
        self._target = run_at
        timeout = self._timeout(wait, promoted)
        if timeout > PEER_BACKOFF:
            logger.debug("sleeping %.3fs toward %s", timeout, run_at)
        self._wake.wait(timeout)
        return False

    def _maintain(self) -> None:
        """The queue janitor and the history partitions ahead (core.partitions), on the scheduler's own
        connection between batches (the janitor looks at the dead-row counts at most every
        `Janitor.every` seconds, the partitions at most hourly). A lost session goes to the loop."""
        try:
            vacuum_on_default(self.janitor, self.using)
            self.keep_ahead(self.using)
        except Exception as exc:
            if is_connection_lost(exc):
                raise
            logger.warning("queue maintenance failed (%r)", exc)

    def _timeout(self, wait: float | None, promoted: int) -> float:
        if wait is None:
            timeout = self._longest_sleep
        elif wait <= 0:
            # Due now: new ones arrived while we promoted (go on), or a peer holds them (back off).
            timeout = 0.0 if promoted else PEER_BACKOFF
        else:
            timeout = min(wait, self._longest_sleep)
        return max(0.0, min(timeout, self._next_beat - time.monotonic()))

    def _on_schedule_ring(self, payload: str) -> None:
        """Doorbell thread: wake the loop only for a job due before the one it sleeps toward."""
        target = self._target
        try:
            run_at = datetime.fromisoformat(payload)
        except ValueError:
            run_at = None
        if target is None or run_at is None or run_at.tzinfo is None or run_at < target:
            logger.debug("woken by the doorbell for run_at %s (sleeping toward %s)", payload, target)
            self._wake.set()

    # --- heartbeat, signals, connection -------------------------------------------------------------
    def _maybe_beat(self) -> None:
        if self.worker is None or time.monotonic() < self._next_beat:
            return
        heartbeat.beat(self.worker, processed=self._unreported, reconnects=reconnects())
        self._unreported = 0
        self._next_beat = time.monotonic() + self.heartbeat_interval
        if self._window_promoted:
            logger.info("promoted %d in the last %gs; max lag %.3fs", self._window_promoted,
                        self.heartbeat_interval, self._window_max_lag, extra={"count": self._window_promoted})
            self._window_promoted = 0
            self._window_max_lag = 0.0

    def _sign_off(self) -> None:
        if self.worker is None:
            return
        try:
            heartbeat.beat(self.worker, processed=self._unreported)
            heartbeat.stop(self.worker)
            self._unreported = 0
        except DatabaseError as exc:
            logger.warning("could not record the scheduler's stop (%s)", type(exc).__name__)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals are delivered to the main thread only; the caller stops us
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._stop.is_set():
            logger.warning("received %s again; exiting now", name)
            os._exit(1)
        logger.info("received %s; finishing the current batch, then stopping", name)
        self.stop()

    def _name_connection(self) -> None:
        """Label this process's connection in pg_stat_activity (Django reconnects with OPTIONS)."""
        connection = connections[self.using]
        options = connection.settings_dict.setdefault("OPTIONS", {})
        self._previous_name = (options.get("application_name"),)
        options["application_name"] = self.application_name[:63]
        self._close_connection()  # the next query reconnects under the new name

    def _unname_connection(self) -> None:
        if self._previous_name is None:
            return
        options = connections[self.using].settings_dict["OPTIONS"]
        (previous,) = self._previous_name
        if previous is None:
            options.pop("application_name", None)
        else:
            options["application_name"] = previous
        self._previous_name = None
        self._close_connection()

    def _close_connection(self) -> None:
        try:
            connections[self.using].close()
        except DatabaseError:
            pass  # already broken; Django opens a fresh one on the next query

