"""CPU per delivery of the dispatcher's suppression check (`dispatch.delivery.suppressed_among`).

    .venv/bin/python bench/suppression_check_bench.py [--database-url URL] [--batch 250] [--claims 400]
        [--suppressions 10000]

Builds claims of `--batch` prepared items (recipients already decrypted, as `claim_and_start` leaves
them) for two tenants whose suppression lists hold `--suppressions` entries, then runs the check on
each claim: one statement per claim. Reports this process's CPU microseconds per delivery
(`time.process_time`: the blind indexes, the parameters and psycopg's dumping and parsing; the
server's work is not in it) and the wall time per claim. The database is migrated and its
suppressions table emptied and refilled (a throwaway database: `omnipost_bench_suppressions`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_DB = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_bench_suppressions"
BENCH_KEY = "x8ROxZ3gJ9D2CFFGZuxGvUQoLhPn7cVeLBcLd2R9s0c="


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=DEFAULT_DB)
    parser.add_argument("--batch", type=int, default=250)
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--suppressions", type=int, default=10000)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from ingest_bench import ensure_database

    ensure_database(args.database_url)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings", "DATABASE_URL": args.database_url,
           "DEBUG": "false", "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
           "OMNIPOST_ENCRYPTION_KEYS": BENCH_KEY, "OMNIPOST_LOG_LEVEL": "WARNING"}  # fmt: skip
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connection

    from core.models import Tenant
    from dispatch.delivery import DispatchLease, Prepared, suppressed_among
    from recipients import suppressions

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE suppressions")
    tenants = [Tenant.objects.create(name=f"suppression-bench-{uuid.uuid4().hex[:8]}") for _ in range(2)]
    entries = [suppressions.Entry(tenants[i % 2].pk, "email", f"blocked{i}@example.com", "hard_bounce")
               for i in range(args.suppressions)]  # fmt: skip
    for start in range(0, len(entries), 1000):
        suppressions.suppress_many(entries[start : start + 1000])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE suppressions")
    now = datetime.now(UTC)

    def claim(n: int) -> list[Prepared]:
        items = []
        for i in range(args.batch):
            lease = DispatchLease(i, uuid.uuid4(), 1, False, str(uuid.uuid4()), str(tenants[i % 2].pk))
            address = f"blocked{(n * args.batch + i) % args.suppressions}@example.com" if i % 50 == 0 else (
                f"user{n}-{i}@example.com")  # fmt: skip
            items.append(Prepared(lease, "email", "", "s", "b", {}, now, 1, 1, address, "general"))
        return items

    claims = [claim(n) for n in range(args.claims)]
    for item in claims[:20]:
        suppressed_among(item)
    walls = []
    blocked = 0
    started = time.process_time()
    for item in claims:
        t = time.perf_counter()
        blocked += len(suppressed_among(item))
        walls.append(time.perf_counter() - t)
    cpu = time.process_time() - started
    if os.environ.get("BENCH_PROFILE"):
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        for item in claims[:100]:
            suppressed_among(item)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    deliveries = args.batch * args.claims
    print(f"{deliveries} deliveries in {args.claims} claims of {args.batch}, {args.suppressions} suppressions, "
          f"{blocked} blocked")
    print(f"CPU per delivery: {cpu / deliveries * 1e6:.2f} µs; wall per claim: median "
          f"{statistics.median(walls) * 1000:.2f} ms, p99 {sorted(walls)[int(len(walls) * 0.99)] * 1000:.2f} ms")


if __name__ == "__main__":
    main()
