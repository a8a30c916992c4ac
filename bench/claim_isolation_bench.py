"""A small queue's delivery rate while another queue is deep (PostgreSQL; issue 19, item 7).

    .venv/bin/python bench/claim_isolation_bench.py [--items 20000] [--backlog 1000000] [--repeats 3]
        [--database-url URL]

Each run seeds `--items` queued notifications in queue `small` and starts one dispatcher
(`run_dispatcher --queues small --max-items N`) against a loopback webhook receiver (a
subprocess); rate = items / the dispatcher's wall time. Runs alternate between an idle system and
one where queue `default` holds `--backlog` more ready items that nothing claims (plus as many
again waiting out a backoff when `--backoff` is given), so the ratio loaded / idle is what a deep
queue elsewhere costs. The backlog is seeded once and stays through the loaded runs.

Uses (creates, migrates and overwrites) its own database, by default `omnipost_claim_bench`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.standalone import create_database, setup_django, sql  # noqa: E402

DEFAULT_URL = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_claim_bench"


def _seed_queue(tenant, prov, queue_name: str, count: int, *, delay_seconds: float = 0.0) -> None:  # noqa: ANN001
    """`count` queued notifications with live items in `queue_name`, in two INSERT … SELECT."""
    from notifications.models import Notification

    token = Notification._meta.get_field("recipient").get_prep_value("https://example.test/h")
    for start in range(0, count, 200_000):
        chunk = min(200_000, count - start)
        ids = [row[0] for row in sql(
            """
            INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
                subject, body, priority, queue, status, metadata, attempt_count, attempt_offset, last_error_code,
                created_at, updated_at)
            SELECT gen_random_uuid(), %s, 'webhook', %s, 'h***', %s, '{}', 's', 'b', 5, %s, 'queued', '{}', 0, 0, '',
                   now(), now()
            FROM generate_series(1, %s)
            RETURNING id
            """,
            [tenant.pk, token, prov.pk, queue_name, chunk],
        )]
        sql(
            """
            INSERT INTO queue_state (queue_name, priority, payload_json, enqueued_at, available_at, attempts,
                                     tenant_id, notification_id, provider_id, rate_limited, ready)
            SELECT %s, 5, '{"channel": "webhook"}'::jsonb, now() + %s * interval '1 second',
                   now() + %s * interval '1 second', 0, %s, n, %s, false, %s <= 0
            FROM unnest(%s::uuid[]) AS n
            """,
            [queue_name, delay_seconds, delay_seconds, tenant.pk, prov.pk, delay_seconds, ids],
        )


def _run_dispatcher(url: str, items: int) -> float:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings_test",
           "OMNIPOST_LOG_LEVEL": "WARNING"}
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "manage.py", "run_dispatcher", "--no-jitter", "--queues", "small", "--max-items", str(items)],
        cwd=ROOT, env=env, check=True, timeout=600,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--backoff", action="store_true", help="also as many items in backoff in `default`")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--database-url", default=DEFAULT_URL)
    args = parser.parse_args()
    create_database(args.database_url)
    setup_django(args.database_url)
    from core.models import Tenant
    from providers.models import Provider
    from tests.support.receivers import TEST_SIGNING_SECRET, spawn_receiver

    sql("TRUNCATE queue_state, scheduled_jobs, delivery_attempts, notifications, providers, workers, tenants CASCADE")
    tenant = Tenant.objects.create(name="bench")
    rates: dict[str, list[float]] = {"idle": [], "loaded": []}
    with spawn_receiver("--port", "0", "--secret", TEST_SIGNING_SECRET, "--max-seconds", "3600") as receiver:
        prov = Provider.objects.create(tenant=tenant, name="hook", kind="webhook", channel="webhook",
                                       config={"url": receiver.url}, secrets={"signing_secret": TEST_SIGNING_SECRET})
        for phase in ["idle", "loaded"] * args.repeats:
            depth = sql("SELECT count(*) FROM queue_state WHERE queue_name = 'default'")[0][0]
            if phase == "loaded" and depth == 0:
                _seed_queue(tenant, prov, "default", args.backlog)
                if args.backoff:
                    _seed_queue(tenant, prov, "default", args.backlog, delay_seconds=86_400)
            elif phase == "idle" and depth:
                sql("DELETE FROM queue_state WHERE queue_name = 'default'")
                sql("DELETE FROM notifications WHERE queue = 'default'")
            sql("DELETE FROM delivery_attempts")
            sql("DELETE FROM notifications WHERE queue = 'small'")
            _seed_queue(tenant, prov, "small", args.items)
            sql("VACUUM ANALYZE queue_state")
            sql("VACUUM ANALYZE notifications")
            seconds = _run_dispatcher(args.database_url, args.items)
            left = sql("SELECT count(*) FROM queue_state WHERE queue_name = 'small'")[0][0]
            assert left == 0, f"{left} items of queue small not delivered"
            rates[phase].append(args.items / seconds)
            other = sql("SELECT count(*) FROM queue_state WHERE queue_name = 'default'")[0][0]
            print(f"{phase:6} default={other:>9,}  small: {args.items:,} in {seconds:.2f}s = {rates[phase][-1]:,.0f}/s",
                  flush=True)
    idle, loaded = statistics.median(rates["idle"]), statistics.median(rates["loaded"])
    print(f"median idle {idle:,.0f}/s, loaded {loaded:,.0f}/s: loaded/idle = {loaded / idle:.2f}")


if __name__ == "__main__":
    main()
