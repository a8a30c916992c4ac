"""Creating scheduled jobs. The scheduler (queueing/scheduler.py) promotes them when due."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

from queueing.models import ScheduledJob

SCHEDULE_CHANNEL = "omnipost_schedule"


def add_jobs(jobs: Sequence[ScheduledJob], *, using: str = "default") -> list[ScheduledJob]:
    """Insert pending jobs in the caller's transaction (one INSERT) and, on PostgreSQL, ring the
    schedulers' doorbell with the earliest run_at so one sleeping toward a later job wakes up."""
    if not jobs:
        return []
    created = ScheduledJob.objects.using(using).bulk_create(jobs)
    connection = connections[using]
    if connection.vendor == "postgresql":
        earliest = min(job.run_at for job in jobs)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [SCHEDULE_CHANNEL, earliest.isoformat()])
    return created
