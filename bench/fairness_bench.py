"""Tenant fairness: tenant A's drain rate with and without tenant B beside it, and B's pickup.

    DATABASE_URL=postgres://…/a_migrated_bench_db .venv/bin/python bench/fairness_bench.py \
        [-n 100000] [--dispatchers 2] [--b-count 50] [--rounds 1]

Each round, twice: A enqueues n notifications at priority 9 (one INSERT … SELECT each for the
notifications and their queue items), then `--dispatchers` real `run_dispatcher` processes drain
them into a bench receiver (benchmarks.receiver, 0 ms). The second time, tenant B sends `--b-count`
notifications at priority 5, one every 20 ms through `create_notifications` (as the API stores
them), while A's backlog drains. Reported: A's steady rate (receiver arrivals between the 10th and
the 90th percentile) alone and with B, their ratio, and B's pickup (its commit → its arrival) p50/p99.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")
os.environ.update(DEBUG="false", OMNIPOST_ALLOW_PRIVATE_DESTINATIONS="true", OMNIPOST_LOG_LEVEL="WARNING")
os.environ.setdefault("SECRET_KEY", "omnipost-bench-only")
os.environ.setdefault("OMNIPOST_ENCRYPTION_KEYS", "x8ROxZ3gJ9D2CFFGZuxGvUQoLhPn7cVeLBcLd2R9s0c=")


def bulk_queue(tenant, prov, count: int, priority: int) -> None:  # noqa: ANN001
    from django.db import connection

    from notifications.models import Notification

    token = Notification._meta.get_field("recipient").get_prep_value("https://example.test/fair")
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH n AS (
                INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
                    subject, body, priority, queue, status, metadata, attempt_count, attempt_offset, last_error_code,
                    created_at, updated_at)
                SELECT gen_random_uuid(), %s, 'webhook', %s, 'h***', %s, '{}', 's', 'b', %s, 'default', 'queued', '{}',
                       0, 0, '', now(), now()
                FROM generate_series(1, %s)
                RETURNING id
            )
            INSERT INTO queue_state (queue_name, priority, payload_json, enqueued_at, available_at, attempts,
                                     tenant_id, notification_id, provider_id, rate_limited)
            SELECT 'default', %s, '{}'::jsonb, now(), now(), 0, %s, n.id, %s, false FROM n
            """,
            [tenant.pk, token, prov.pk, priority, count, priority, tenant.pk, prov.pk],
        )
        cursor.execute("VACUUM ANALYZE queue_state")


def drain(args: argparse.Namespace, tenant_a, tenant_b, prov_a, prov_b, with_b: bool):  # noqa: ANN001, ANN201
    from django.db import connection

    from benchmarks.receiver import ReceiverProcess, steady_rate
    from notifications.services import NotificationSpec, create_notifications
    from queueing.models import QueueItem

    receiver_a, receiver_b = ReceiverProcess(), ReceiverProcess()
    from providers.models import Provider

    Provider.objects.filter(pk=prov_a.pk).update(config={"url": receiver_a.url})
    Provider.objects.filter(pk=prov_b.pk).update(config={"url": receiver_b.url})
    bulk_queue(tenant_a, prov_a, args.notifications, 9)
    env = {**os.environ}
    procs = [
        subprocess.Popen(  # noqa: S603
            [sys.executable, "manage.py", "run_dispatcher", "--no-jitter", "--batch-size", "250", "--concurrency",
             "500"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(args.dispatchers)
    ]
    sent: dict[str, float] = {}
    try:
        if with_b:
            time.sleep(1.0)  # A's drain under way
            for _ in range(args.b_count):
                spec = NotificationSpec(channel="webhook", recipient="https://example.test/b", provider=prov_b,
                                        subject="s", body="b", priority=5)  # fmt: skip
                [n] = create_notifications(tenant_b, [spec], actor="bench")
                sent[str(n.id)] = time.time()
                time.sleep(0.02)
        deadline = time.monotonic() + 600
        while QueueItem.objects.filter(tenant_id__in=[tenant_a.pk, tenant_b.pk]).exists():
            if time.monotonic() > deadline:
                raise SystemExit("fairness_bench: the drain took over 600 s")
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        connection.close()
    _, arrivals_a = receiver_a.stop()
    _, arrivals_b = receiver_b.stop()
    pickups = sorted(arrivals_b[k] - at for k, at in sent.items() if k in arrivals_b)
    return steady_rate(arrivals_a.values()) or 0.0, pickups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--notifications", type=int, default=100_000)
    parser.add_argument("--dispatchers", type=int, default=2)
    parser.add_argument("--b-count", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    import django

    django.setup()
    from benchmarks.runner import SIGNING_SECRET
    from core.models import Tenant
    from providers.models import Provider

    run = uuid.uuid4().hex[:8]
    tenant_a = Tenant.objects.create(name=f"fair-a-{run}")
    tenant_b = Tenant.objects.create(name=f"fair-b-{run}")
    prov_a, prov_b = (
        Provider.objects.create(tenant=t, name="hook", kind="webhook", channel="webhook",
                                config={"url": "http://127.0.0.1:9/hook"}, secrets={"signing_secret": SIGNING_SECRET})
        for t in (tenant_a, tenant_b)
    )  # fmt: skip
    alone, beside, all_pickups = [], [], []
    for round_no in range(1, args.rounds + 1):
        for with_b in (False, True) if round_no % 2 else (True, False):
            rate, pickups = drain(args, tenant_a, tenant_b, prov_a, prov_b, with_b)
            (beside if with_b else alone).append(rate)
            all_pickups += pickups
            print(f"round {round_no}: A {'with B' if with_b else 'alone'} {rate:,.0f} /s", file=sys.stderr)
    a_alone, a_beside = statistics.median(alone), statistics.median(beside)
    all_pickups.sort()
    p50 = statistics.median(all_pickups) if all_pickups else float("nan")
    p99 = all_pickups[min(len(all_pickups) - 1, int(0.99 * len(all_pickups)))] if all_pickups else float("nan")
    print("| A alone /s | A with B /s | ratio | B pickup p50 | B pickup p99 |")
    print("|---|---|---|---|---|")
    ratio = a_beside / a_alone if a_alone else float("nan")
    print(f"| {a_alone:,.0f} | {a_beside:,.0f} | {ratio:.0%} | {p50 * 1000:.1f} ms | {p99 * 1000:.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
