"""What retention costs on the attempts history: dropping day partitions against deleting rows.

    .venv/bin/python bench/prune_bench.py [--database-url URL] [--rows 10000000] [--days 60] [--older-than 30]
                                          [--batch 5000]

Fills `delivery_attempts` (partitioned by day, core.partitions) with `--rows` rows spread evenly over the
last `--days` days (one INSERT … SELECT generate_series), and a plain copy of the same rows in
`prune_bench_plain` with the indexes the table had before it was partitioned (primary key, the
(notification_id, number) unique constraint, finished_at). Then times, for a `--older-than` cutoff:

- partitions: the history pass of `manage.py prune` (operations.retention.prune_history): every day
  partition wholly past the cutoff DROPped, the day the cutoff falls in trimmed in page batches;
- delete: the old path on the plain copy, batched `DELETE … WHERE id = ANY(…)` of `--batch` rows,
  oldest first (keyset on finished_at), each batch a transaction, and the VACUUM the deleted rows
  then need before their space is reused (the partitions leave nothing to vacuum).

Prints one JSON line per path: seconds, batches, rows removed. Uses (creates, migrates and overwrites)
its own database, by default `omnipost_prune_bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_DB = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_prune_bench"

from metrics_bench import prepare  # noqa: E402 - bench/ is the script's directory: migrate a throwaway database, set Django up


def fill(rows: int, days: int) -> float:
    from datetime import UTC, datetime, timedelta

    from django.db import connection

    from core import partitions

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE delivery_attempts")
        cursor.execute("DROP TABLE IF EXISTS prune_bench_plain")
    # the day partitions a deployment would have had: one a day since the oldest row
    partitions.ensure("delivery_attempts", start=datetime.now(UTC).date() - timedelta(days=days + 1))
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at, finished_at,
                outcome, error_class, error_code, error_message, http_status, duration_ms)
            SELECT '00000000-0000-0000-0000-000000000001', gen_random_uuid(), 1, 1, t, t, 'delivered', '', '', '',
                   200, 3
            FROM (SELECT now() - %s * interval '1 day' * g / %s AS t FROM generate_series(1, %s) AS g) AS s
            """,
            [days, rows, rows],
        )
        cursor.execute(
            "CREATE TABLE prune_bench_plain (LIKE delivery_attempts INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        cursor.execute("INSERT INTO prune_bench_plain SELECT * FROM delivery_attempts")
        cursor.execute("ALTER TABLE prune_bench_plain ADD PRIMARY KEY (id)")
        cursor.execute("ALTER TABLE prune_bench_plain ADD UNIQUE (notification_id, number)")
        cursor.execute("CREATE INDEX ON prune_bench_plain (finished_at)")
        cursor.execute("VACUUM ANALYZE prune_bench_plain")
        cursor.execute("ANALYZE delivery_attempts")
    return time.perf_counter() - started


def via_partitions(days: float, batch: int) -> dict:
    from operations import retention

    pruner = retention.Pruner(older_than_days=days, batch_size=batch)
    totals = retention.Totals()
    started = time.perf_counter()
    retention.prune_history(pruner, totals, stop=threading.Event(), progress=retention.no_progress)
    return {
        "path": "partitions", "seconds": round(time.perf_counter() - started, 3),
        "partitions_dropped": totals.partitions_dropped, "rows_dropped_estimated": totals.partition_rows,
        "rows_trimmed": totals.history_rows, "batches": totals.batches,
        "longest_transaction_s": round(totals.longest_batch, 3),
    }  # fmt: skip


def via_delete(days: float, batch: int) -> dict:
    from datetime import timedelta

    from django.db import connection, transaction
    from django.utils import timezone

    cutoff = timezone.now() - timedelta(days=days)
    removed = batches = 0
    longest = 0.0
    started = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM prune_bench_plain WHERE id = ANY(ARRAY(SELECT id FROM prune_bench_plain "
                "WHERE finished_at < %s ORDER BY finished_at LIMIT %s))",
                [cutoff, batch],
            )
            n = cursor.rowcount
        longest = max(longest, time.perf_counter() - t0)
        if not n:
            break
        removed += n
        batches += 1
    deleted_s = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("VACUUM prune_bench_plain")
    return {
        "path": "delete", "seconds": round(time.perf_counter() - started, 3), "delete_s": round(deleted_s, 3),
        "vacuum_s": round(time.perf_counter() - started - deleted_s, 3), "rows": removed, "batches": batches,
        "longest_transaction_s": round(longest, 3),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=DEFAULT_DB)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--older-than", type=float, default=30.0)
    parser.add_argument("--batch", type=int, default=5000)
    args = parser.parse_args()
    prepare(args.database_url)
    print(json.dumps({"rows": args.rows, "days": args.days, "fill_s": round(fill(args.rows, args.days), 1)}))
    print(json.dumps(via_partitions(args.older_than, args.batch)))
    print(json.dumps(via_delete(args.older_than, args.batch)))
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM delivery_attempts")
        left_partitioned = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM prune_bench_plain")
        left_plain = cursor.fetchone()[0]
        cursor.execute("DROP TABLE prune_bench_plain")
    print(json.dumps({"rows_left": {"partitioned": left_partitioned, "plain": left_plain}}))


if __name__ == "__main__":
    main()
