"""Helpers for the scheduler tests: scheduled notifications in bulk, scheduler processes, lag figures."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# --- data --------------------------------------------------------------------------------------------
def db_now() -> datetime:
    """The database's clock (inside a test transaction: the transaction's start)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def scheduled(tenant, prov, *, seconds: float, priority: int = 5, queue_name: str = "default",  # noqa: ANN001
              status: str = "scheduled", job_status: str = "pending"):  # noqa: ANN201
    """One scheduled notification and its job, due `seconds` from the database's now (ORM + add_jobs)."""
    from queueing.models import ScheduledJob
    from queueing.schedule import add_jobs
    from tests import factories

    note = factories.notifications(tenant, prov, 1, priority=priority, queue_name=queue_name, status=status)[0]
    run_at = db_now() + timedelta(seconds=seconds)
    note.scheduled_for = run_at
    note.save(update_fields=["scheduled_for"])
    add_jobs([ScheduledJob(tenant=tenant, notification_id=note.pk, run_at=run_at, status=job_status)])
    return note


def bulk_scheduled_sql(tenant, prov, count: int, *, start: float, spread: float = 0.0,  # noqa: ANN001
                       shuffle: bool = False, notify: bool = False) -> None:
    """`count` scheduled notifications and pending jobs in one statement, run_at from
    now()+start to now()+start+spread seconds, evenly spaced (inserted in random order with `shuffle`).
    With `notify`, rings the schedulers' doorbell with the earliest run_at as add_jobs would."""
    from django.db import connection

    from notifications.models import Notification
    from queueing.schedule import SCHEDULE_CHANNEL

    sample = Notification(tenant=tenant, provider=prov, channel=prov.channel, recipient="https://example.test/h")
    token = Notification._meta.get_field("recipient").get_prep_value(sample.recipient)
    order = "ORDER BY random()" if shuffle else "ORDER BY g"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH s AS (
                SELECT g, now() + (%(start)s + %(spread)s * (g - 1) / %(count)s) * interval '1 second' AS run_at
                FROM generate_series(1, %(count)s) AS g {order}
            ), n AS (
                INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
                    subject, body, priority, queue, status, scheduled_for, metadata, attempt_count, attempt_offset,
                    last_error_code, created_at, updated_at)
                SELECT gen_random_uuid(), %(tenant)s, %(channel)s, %(token)s, 'h***', %(provider)s, '{{}}', 's', 'b',
                       5, 'default', 'scheduled', s.run_at, '{{}}', 0, 0, '', now(), now()
                FROM s
                RETURNING id, tenant_id, scheduled_for
            )
            INSERT INTO scheduled_jobs (job_id, notification_id, tenant_id, run_at, status, created_at)
            SELECT gen_random_uuid(), id, tenant_id, scheduled_for, 'pending', now() FROM n
            """,
            {"start": float(start), "spread": float(spread), "count": count, "tenant": tenant.pk,
             "channel": prov.channel, "token": token, "provider": prov.pk},
        )
        if notify:
            cursor.execute(
                "SELECT pg_notify(%s, (SELECT min(run_at)::text FROM scheduled_jobs WHERE status = 'pending'))",
                [SCHEDULE_CHANNEL],
            )


def lag_stats(tenant) -> dict[str, float]:  # noqa: ANN001
    """Enqueue lag (queue_state.enqueued_at - run_at) over a tenant's promoted jobs, in seconds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY lag),
                   max(lag), min(lag)
            FROM (SELECT extract(epoch FROM q.enqueued_at - j.run_at)::float8 AS lag
                  FROM scheduled_jobs j JOIN queue_state q ON q.notification_id = j.notification_id
                  WHERE j.tenant_id = %s) AS lags
            """,
            [tenant.pk],
        )
        count, p50, p99, worst, best = cursor.fetchone()
    return {"count": count, "p50": p50, "p99": p99, "max": worst, "min": best}


# --- processes ---------------------------------------------------------------------------------------
def start_scheduler(env: dict, log: Path, *args: str) -> subprocess.Popen:
    """A real `manage.py run_scheduler --no-jitter …` process, stdout and stderr to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(  # noqa: S603
            [sys.executable, "manage.py", "run_scheduler", "--no-jitter", *args],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )


def wait_for_text(log: Path, text: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None, f"scheduler exited ({proc.returncode}):\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout}s:\n{log.read_text()}"
        time.sleep(0.05)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(interval)
