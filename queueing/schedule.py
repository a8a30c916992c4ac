"""Creating scheduled jobs. The scheduler (queueing/scheduler.py) promotes them when due."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

from queueing.models import ScheduledJob
from queueing.queue import ring_after_commit

SCHEDULE_CHANNEL = "omnipost_schedule"


def add_jobs(jobs: Sequence[ScheduledJob], *, using: str = "default") -> list[ScheduledJob]:
    """Insert pending jobs in the caller's transaction (one INSERT) and, on PostgreSQL, ring the
    schedulers' doorbell after commit with the earliest run_at, so one sleeping toward a later job
    wakes up."""
    if not jobs:
        return []
    created = ScheduledJob.objects.using(using).bulk_create(jobs)
    if connections[using].vendor == "postgresql":
        ring_after_commit(SCHEDULE_CHANNEL, min(job.run_at for job in jobs).isoformat(), using)
    return created
