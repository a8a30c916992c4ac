"""What `/metrics` costs as history grows, and what the record statement costs per delivery.

    .venv/bin/python bench/metrics_bench.py [--database-url URL] [--sizes 1000 1000000] [--scrapes 15]
    .venv/bin/python bench/metrics_bench.py --record [--batches 60] [--batch 100]

Scrape: fills `delivery_attempts` with each of `--sizes` rows (generate_series, 1,000 notifications
with many attempts each, three outcomes) and times `--scrapes` whole scrapes (the view, as
Prometheus calls it); prints the median and the slowest. The figure should not move with the
number of rows: a scrape reads counters, not the attempts.

Record (`--record`): claims `--batch` items at a time, marks them delivered and times
`record_outcomes` (the dispatcher's one statement per batch), reporting wall and PostgreSQL
backend CPU microseconds per delivery (the backend's /proc/<pid>/stat, so the server must run on
this machine), median over `--batches` batches.

Uses (creates, migrates and overwrites) its own database, by default `omnipost_metrics_bench`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_DB = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_metrics_bench"


def prepare(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(parts._replace(path="/postgres").geturl(), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="omnipost_site.settings_test")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=os.environ, check=True)
    import django

    django.setup()


def empty() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET omnipost.allow_audit_truncate = on")
        cursor.execute(
            "TRUNCATE delivery_attempts, dead_letter_queue, queue_state, scheduled_jobs, notifications, providers, "
            "tenants CASCADE"
        )
        # Counters live on in a real deployment; here each size starts from nothing.
        cursor.execute("SELECT to_regclass('delivery_counters') IS NOT NULL")
        if cursor.fetchone()[0]:
            cursor.execute("TRUNCATE delivery_counters")


def tenant_and_provider():  # noqa: ANN201
    from core.models import Tenant
    from tests import factories

    tenant = Tenant.objects.create(name="bench")
    return tenant, factories.provider(tenant, "bench-hook")


def fill_attempts(rows: int) -> None:
    from django.db import connection

    tenant, provider = tenant_and_provider()
    per = max(1, rows // 1000)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
                subject, body, priority, queue, status, metadata, attempt_count, attempt_offset, last_error_code,
                created_at, updated_at)
            SELECT gen_random_uuid(), %s, 'webhook', 'x', 'h***', %s, '{}', 's', 'b', 5, 'default', 'delivered', '{}',
                   %s, 0, '', now(), now()
            FROM generate_series(1, %s)
            """,
            [tenant.pk, provider.pk, per, min(rows, 1000)],
        )
        cursor.execute(
            """
            INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at, finished_at,
                                           outcome, error_class, error_code, error_message, duration_ms)
            SELECT n.tenant_id, n.id, i, n.provider_id, now(), now(),
                   (ARRAY['delivered', 'transient_error', 'permanent_error'])[1 + i %% 3], '', '', '', 1
            FROM notifications n, generate_series(1, %s) AS i
            """,
            [per],
        )
        cursor.execute("ANALYZE delivery_attempts")
        cursor.execute("SELECT count(*) FROM delivery_attempts")
        print(f"  delivery_attempts: {cursor.fetchone()[0]:,} rows")


def scrape_times(scrapes: int) -> list[float]:
    from django.db import reset_queries
    from django.test import RequestFactory

    from omnipost_site.ops.metrics import metrics

    factory = RequestFactory()
    times = []
    for _ in range(scrapes + 1):
        reset_queries()
        t0 = time.perf_counter()
        response = metrics(factory.get("/metrics"))
        times.append(time.perf_counter() - t0)
        assert response.status_code == 200, response.content[:200]
    return times[1:]  # the first warms the connection and caches


def bench_scrapes(sizes: list[int], scrapes: int) -> None:
    for rows in sizes:
        empty()
        print(f"{rows:,} attempt rows:")
        fill_attempts(rows)
        times = scrape_times(scrapes)
        print(f"  scrape median {statistics.median(times) * 1000:.2f} ms, slowest {max(times) * 1000:.2f} ms "
              f"({scrapes} scrapes)")  # fmt: skip


def backend_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_record(batches: int, batch: int) -> None:
    from django.db import connection

    from dispatch.delivery import Attempt, Outcome, claim_and_start, record_outcomes
    from tests import factories

    empty()
    tenant, provider = tenant_and_provider()
    factories.bulk_queued_sql(tenant, provider, batches * batch)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queue_state; ANALYZE notifications")
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    walls, cpus = [], []
    for _ in range(batches):
        prepared, _ = claim_and_start(batch, lease_seconds=60)
        now = datetime.now(UTC)
        outcomes = [
            Outcome(p.lease, "delivered", Attempt(p.attempt_number, now, now, "delivered", duration_ms=3))
            for p in prepared
        ]
        cpu0, t0 = backend_cpu_seconds(pid), time.perf_counter()
        record_outcomes(outcomes)
        walls.append((time.perf_counter() - t0) / len(outcomes))
        cpus.append((backend_cpu_seconds(pid) - cpu0) / len(outcomes))
    # /proc CPU ticks are 10 ms: per-batch figures are coarse, their sum is not.
    print(f"record_outcomes, {batches} batches of {batch}: wall median {statistics.median(walls) * 1e6:.1f} "
          f"µs/delivery, PostgreSQL CPU {sum(cpus) / len(cpus) * 1e6:.1f} µs/delivery (mean)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 1_000_000])
    parser.add_argument("--scrapes", type=int, default=15)
    parser.add_argument("--record", action="store_true", help="time the record statement instead of scrapes")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    prepare(args.database_url)
    if args.record:
        bench_record(args.batches, args.batch)
    else:
        bench_scrapes(args.sizes, args.scrapes)


if __name__ == "__main__":
    main()
