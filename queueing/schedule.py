"""Creating scheduled jobs. The scheduler (queueing/scheduler.py) promotes them when due."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

from queueing.models import ScheduledJob
from queueing.queue import ring_after_commit

SCHEDULE_CHANNEL = "omnipost_schedule"


def insert_jobs_sql(source: str) -> str:
    """PostgreSQL: `INSERT INTO scheduled_jobs … SELECT` of pending jobs from `source`, a FROM item
    (aliased `s`) with the columns job_id, tenant_id, notification_id, run_at, created_at; for a
    statement that creates notifications and their jobs together (notifications.services). The
    caller rings SCHEDULE_CHANNEL after commit, as `add_jobs` does."""
    columns = "job_id, tenant_id, notification_id, run_at, status, created_at, executed_at"
    return (  # `source` is the caller's fixed SQL; values are parameters
        f"INSERT INTO scheduled_jobs ({columns}) "  # noqa: S608
        f"SELECT s.job_id, s.tenant_id, s.notification_id, s.run_at, 'pending', s.created_at, NULL FROM {source}"
    )


def ring_schedulers(jobs: Sequence[ScheduledJob], *, using: str = "default") -> None:
    """After commit, wake the schedulers with the earliest run_at (PostgreSQL)."""
    if jobs and connections[using].vendor == "postgresql":
        ring_after_commit(SCHEDULE_CHANNEL, min(job.run_at for job in jobs).isoformat(), using)


def add_jobs(jobs: Sequence[ScheduledJob], *, using: str = "default") -> list[ScheduledJob]:
    """Insert pending jobs in the caller's transaction (one INSERT) and, on PostgreSQL, ring the
    schedulers' doorbell after commit with the earliest run_at, so one sleeping toward a later job
    wakes up."""
    if not jobs:
        return []
    created = ScheduledJob.objects.using(using).bulk_create(jobs)
    ring_schedulers(jobs, using=using)
    return created
