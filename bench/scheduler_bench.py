"""Scheduler throughput: jobs promoted per second by 1 and 3 scheduler processes (PostgreSQL).

    .venv/bin/python bench/scheduler_bench.py [--pending 100000,1000000] [--due 100000]
        [--schedulers 1,3] [--batch-size 1000] [--repeats 3] [--database-url URL]

For each pending count it seeds that many scheduled notifications with pending jobs, of which
`--due` are overdue (run_at spread over the past hour) and the rest are due tomorrow, then for each
scheduler count starts that many processes together; each promotes batches (`Scheduler.run_once`,
the same statement `run_scheduler` runs) until nothing is due. Rate = due jobs / wall time from the
common start to the last process's end. Between runs the promoted rows are reset and the tables
vacuumed. Each run also checks that every due job was promoted exactly once.

Uses (creates, migrates and overwrites) its own database, by default `omnipost_sched_bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.standalone import create_database, setup_django, sql  # noqa: E402

DEFAULT_URL = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_sched_bench"


def _seed(pending: int, due: int) -> None:
    from core.models import Tenant
    from notifications.models import Notification
    from providers.models import Provider

    sql("TRUNCATE queue_state, scheduled_jobs, notifications, providers, workers, tenants CASCADE")
    tenant = Tenant.objects.create(name="bench")
    prov = Provider.objects.create(tenant=tenant, name="hook", kind="webhook", channel="webhook",
                                   config={"url": "http://127.0.0.1:9/hook"})
    sample = Notification(tenant=tenant, provider=prov, channel="webhook", recipient="https://example.test/h")
    token = Notification._meta.get_field("recipient").get_prep_value(sample.recipient)
    for start in range(0, pending, 200_000):
        count = min(200_000, pending - start)
        sql(
            """
            WITH s AS (
                SELECT CASE WHEN g <= %(due)s THEN now() - interval '1 hour' + g * (interval '1 hour' / %(due)s)
                            ELSE now() + interval '1 day' + g * interval '1 millisecond' END AS run_at
                FROM generate_series(%(first)s, %(last)s) AS g ORDER BY random()
            ), n AS (
                INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
                    subject, body, priority, queue, status, scheduled_for, metadata, attempt_count, attempt_offset,
                    last_error_code, created_at, updated_at)
                SELECT gen_random_uuid(), %(tenant)s, 'webhook', %(token)s, 'h***', %(provider)s, '{}', 's', 'b', 5,
                       'default', 'scheduled', s.run_at, '{}', 0, 0, '', now(), now()
                FROM s RETURNING id, tenant_id, scheduled_for
            )
            INSERT INTO scheduled_jobs (job_id, notification_id, tenant_id, run_at, status, created_at)
            SELECT gen_random_uuid(), id, tenant_id, scheduled_for, 'pending', now() FROM n
            """,
            {"due": max(due, 1), "first": start + 1, "last": start + count, "tenant": tenant.pk,
             "token": token, "provider": prov.pk},
        )
    _vacuum()


def _vacuum() -> None:
    from django.db import connection

    connection.ensure_connection()
    for table in ("scheduled_jobs", "notifications", "queue_state"):
        sql(f"VACUUM ANALYZE {table}")


def _reset() -> None:
    """Put the promoted jobs back to pending (their run_at unchanged, so they are due again)."""
    sql("TRUNCATE queue_state")
    sql("UPDATE scheduled_jobs SET status = 'pending', executed_at = NULL WHERE status <> 'pending'")
    sql("UPDATE notifications SET status = 'scheduled', enqueued_at = NULL WHERE status <> 'scheduled'")
    _vacuum()


def _run(schedulers: int, batch_size: int, url: str) -> dict:
    start_at = time.time() + 3.0  # every process connected and waiting before the common start
    env = {**os.environ, "DATABASE_URL": url}
    procs = [
        subprocess.Popen(  # noqa: S603
            [sys.executable, __file__, "--worker", "--start-at", str(start_at), "--batch-size", str(batch_size),
             "--database-url", url],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        )
        for _ in range(schedulers)
    ]
    results = [json.loads(proc.communicate(timeout=900)[0].strip().splitlines()[-1]) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    elapsed = max(r["ended"] for r in results) - start_at
    promoted = sum(r["promoted"] for r in results)
    return {"promoted": promoted, "elapsed": elapsed, "rate": promoted / elapsed,
            "batches": sum(r["batches"] for r in results), "per_process": [r["promoted"] for r in results]}


def _worker(args: argparse.Namespace) -> int:
    setup_django(args.database_url)
    from django.db import connection

    from queueing.scheduler import Scheduler

    scheduler = Scheduler(batch_size=args.batch_size, jitter=0)
    connection.ensure_connection()
    time.sleep(max(0.0, args.start_at - time.time()))
    promoted = batches = 0
    while True:
        promoted += scheduler.run_once()
        batches += 1
        if scheduler.last.claimed < args.batch_size:
            break
    print(json.dumps({"promoted": promoted, "batches": batches, "ended": time.time()}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pending", default="100000,1000000", help="comma-separated pending counts")
    parser.add_argument("--due", type=int, default=100_000, help="how many of the pending jobs are due")
    parser.add_argument("--schedulers", default="1,3")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args)

    create_database(args.database_url)
    setup_django(args.database_url)
    print(f"batch size {args.batch_size}; {args.repeats} runs each, median shown")
    print(f"{'pending':>9} {'due':>8} {'schedulers':>10} {'jobs/s (median)':>16} {'runs (jobs/s)':>28}")
    for pending in (int(p) for p in args.pending.split(",")):
        due = min(args.due, pending)
        started = time.monotonic()
        _seed(pending, due)
        print(f"# seeded {pending:,} pending ({due:,} due) in {time.monotonic() - started:.1f}s", flush=True)
        for schedulers in (int(s) for s in args.schedulers.split(",")):
            rates = []
            for _ in range(args.repeats):
                result = _run(schedulers, args.batch_size, args.database_url)
                queued, distinct = sql("SELECT count(*), count(DISTINCT notification_id) FROM queue_state")[0]
                assert result["promoted"] == due == queued == distinct, (result, queued, distinct)
                assert sql("SELECT count(*) FROM scheduled_jobs WHERE status = 'pending'")[0][0] == pending - due
                rates.append(result["rate"])
                _reset()
            runs = ", ".join(f"{r:,.0f}" for r in rates)
            print(f"{pending:>9,} {due:>8,} {schedulers:>10} {statistics.median(rates):>16,.0f} {runs:>28}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
