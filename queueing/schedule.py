"""Scheduled jobs: creating them, and every statement that writes `scheduled_jobs` (the fragments
the domain's statements compose: the create, the scheduler's promotion, channel fallback, prune).
The scheduler (queueing/scheduler.py) promotes them when due."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import connections
from django.db.models.functions import Now

from queueing import ringer
from queueing.models import ScheduledJob
from queueing.queue import ring_after_commit

SCHEDULE_CHANNEL = "omnipost_schedule"
_KIND = re.compile(r"^[a-z][a-z_]{0,19}$")


def _earlier(kept: str, new: str) -> str:
    return min(kept, new, key=datetime.fromisoformat)


# A scheduler needs only the earliest run_at rung since it last looked: it wakes for it, promotes
# what is due and then sleeps toward the table's next job (queueing.scheduler).
ringer.merge(SCHEDULE_CHANNEL, _earlier)


def insert_jobs_sql(source: str) -> str:
    """`INSERT INTO scheduled_jobs … SELECT` of pending jobs from `source`, a FROM item
    (aliased `s`) with the columns job_id, tenant_id, notification_id, run_at, created_at; for a
    statement that creates notifications and their jobs together (notifications.services). The
    caller rings SCHEDULE_CHANNEL after commit, as `add_jobs` does."""
    columns = "job_id, tenant_id, notification_id, run_at, status, created_at, executed_at"
    return (  # `source` is the caller's fixed SQL; values are parameters
        f"INSERT INTO scheduled_jobs ({columns}) "  # noqa: S608
        f"SELECT s.job_id, s.tenant_id, s.notification_id, s.run_at, 'pending', s.created_at, NULL FROM {source}"
    )


# Jobs timed by the database's clock: each row's run_at is its own instant, or now() + its seconds.
def timed_jobs_sql(source: str, kind: str) -> str:
    """`added AS (INSERT INTO scheduled_jobs …) SELECT <ring>`: the end of a statement that inserts pending
    jobs of `kind` (a checked identifier) from `source`, a FROM item with the columns opaque_id, at
    (timestamptz or NULL) and secs (float8: seconds after the database's now() when `at` is NULL), aliased
    `s`; %(tenant)s is bound by the caller. The schedulers' doorbell rings at commit with the earliest."""
    return f"""added AS (
    INSERT INTO scheduled_jobs (job_id, tenant_id, notification_id, kind, run_at, status, created_at, executed_at)
    SELECT gen_random_uuid(), %(tenant)s, s.opaque_id, '{kind}',
           coalesce(s.at, now() + s.secs * interval '1 second'), 'pending', now(), NULL
    FROM {source}
    RETURNING run_at
)
SELECT {ring_sql("run_at")} FROM added HAVING count(*) > 0"""  # noqa: S608 - the caller's relation, a checked kind


_TIMED_SOURCE = "unnest(%(ids)s::uuid[], %(at)s::timestamptz[], %(secs)s::float8[]) AS s(opaque_id, at, secs)"


def add_timed_jobs(
    tenant_id: object, kind: str, timed: Sequence[tuple[object, datetime | None, float]], *, using: str = "default"
) -> None:
    """Pending jobs of `kind` in the caller's transaction, one statement: each `(opaque id, at, seconds)`
    runs at `at`, or, when `at` is None, `seconds` after the database's now() (the hosts' clocks never
    matter); the schedulers' doorbell rings at commit with the earliest."""
    if not timed:
        return
    if not _KIND.fullmatch(kind):
        raise ValueError(f"a job kind is 1-20 lowercase letters or underscores, not {kind!r}")
    params = {
        "ids": [str(opaque) for opaque, _, _ in timed], "at": [at for _, at, _ in timed],
        "secs": [float(secs) for _, _, secs in timed], "tenant": tenant_id,
    }  # fmt: skip
    with connections[using].cursor() as cursor:
        cursor.execute("WITH " + timed_jobs_sql(_TIMED_SOURCE, kind), params)


def settle_jobs(executed: Sequence[object], cancelled: Sequence[object], *, using: str = "default") -> None:
    """Jobs a handler took (locked) by id: executed, or cancelled (nothing left to promote)."""
    if executed:
        ScheduledJob.objects.using(using).filter(job_id__in=executed).update(
            status=ScheduledJob.Status.EXECUTED, executed_at=Now()
        )
    if cancelled:
        ScheduledJob.objects.using(using).filter(job_id__in=cancelled).update(status=ScheduledJob.Status.CANCELLED)


def postpone_jobs(job_ids: Sequence[object], seconds: float, *, using: str = "default") -> None:
    """Jobs a handler took (locked) but cannot work yet: pending again, due `seconds` after the
    database's now()."""
    if job_ids:
        ScheduledJob.objects.using(using).filter(job_id__in=job_ids).update(
            run_at=Now() + timedelta(seconds=seconds)
        )


def cancel_jobs_for(kind: str, opaque_ids: Sequence[object], *, using: str = "default") -> int:
    """The pending jobs of `kind` standing for `opaque_ids` end cancelled (locking them: a scheduler
    promoting one is waited for, and its job then stays executed)."""
    if not opaque_ids:
        return 0
    return (
        ScheduledJob.objects.using(using)
        .filter(kind=kind, notification_id__in=opaque_ids, status=ScheduledJob.Status.PENDING)
        .update(status=ScheduledJob.Status.CANCELLED)
    )


def ring_schedulers(jobs: Sequence[ScheduledJob], *, using: str = "default") -> None:
    """After commit, wake the schedulers with the earliest run_at."""
    if jobs:
        ring_after_commit(SCHEDULE_CHANNEL, min(job.run_at for job in jobs).isoformat(), using)


def add_jobs(jobs: Sequence[ScheduledJob], *, using: str = "default") -> list[ScheduledJob]:
    """Insert pending jobs in the caller's transaction (one INSERT) and ring the schedulers' doorbell
    after commit with the earliest run_at, so one sleeping toward a later job wakes up."""
    if not jobs:
        return []
    created = ScheduledJob.objects.using(using).bulk_create(jobs)
    ring_schedulers(jobs, using=using)
    return created


def upsert_jobs_sql(source: str) -> str:
    """Like `insert_jobs_sql`, for a notification that may have its job already (one job per
    notification, scheduled_jobs' unique notification_id): a pending job keeps the earlier of its
    run_at and the new one; an executed or cancelled job stays as it is. `source` must hold one row
    per notification. RETURNING the notification_id and run_at of each job now pending."""
    return (
        insert_jobs_sql(source)
        + " ON CONFLICT (notification_id) DO UPDATE SET run_at = least(scheduled_jobs.run_at, EXCLUDED.run_at)"
        " WHERE scheduled_jobs.status = 'pending' RETURNING notification_id, run_at"
    )


def ring_sql(run_at: str) -> str:
    """A SELECT that rings the schedulers' doorbell (at commit) with the ISO text of the
    earliest `run_at` of a FROM item `run_at` names, when it has rows (for a statement's own CTE)."""
    text = f"""to_char(min({run_at}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""
    return f"pg_notify('{SCHEDULE_CHANNEL}', {text})"


def settle_jobs_sql(source: str) -> str:
    """`UPDATE scheduled_jobs … RETURNING j.status, j.run_at` of the jobs in `source` (a relation with
    columns job_id and live): executed when live, else cancelled. A job left out of `source` stays
    pending (its notification was held by someone else: the next batch takes it)."""
    return f"""UPDATE scheduled_jobs j
    SET status = CASE WHEN d.live THEN 'executed' ELSE 'cancelled' END,
        executed_at = CASE WHEN d.live THEN now() END
    FROM {source} d
    WHERE j.job_id = d.job_id
    RETURNING j.status, j.run_at"""  # noqa: S608 - the caller's relation


def cancel_pending_jobs_sql(source: str, condition: str) -> str:
    """`UPDATE scheduled_jobs … RETURNING 1`: the pending jobs of the notifications of `source` (a
    relation with a notification_id, aliased `d`) whose rows meet `condition` are cancelled."""
    return f"""UPDATE scheduled_jobs j SET status = 'cancelled'
        FROM {source} d WHERE {condition} AND j.notification_id = d.notification_id AND j.status = 'pending'
        RETURNING 1"""  # noqa: S608 - the caller's relation and condition


def delete_jobs_sql(ids: str) -> str:
    """`DELETE … RETURNING 1` of the jobs of the notifications whose ids `ids` (an SQL uuid[]) holds
    (prune: a notification goes with its job)."""
    return f"DELETE FROM scheduled_jobs WHERE notification_id = ANY({ids}) RETURNING 1"  # noqa: S608
