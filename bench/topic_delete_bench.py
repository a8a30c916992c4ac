"""Deleting a topic of a million members: in chunks by the scheduler, against one DELETE.

    .venv/bin/python bench/topic_delete_bench.py [--database-url URL] [--members 1000000]
        [--dispatchers 1] [--idle-seconds 8] [--kill-at F] [--no-baseline] [--markdown FILE]

On its own database (default `omnipost_bench_topic_delete` on the local server, dropped and created
afresh): two topics of tenant A are filled with `--members` memberships each straight in SQL (one
`INSERT … SELECT generate_series`, not through the API). With `--dispatchers` real dispatchers
delivering, another tenant's single creates and tenant A's priority-9 creates are probed, one of each
every 50 ms (pickup = arrival at the receiver - return of the create), first idle, then:

1. baseline (unless `--no-baseline`): one `DELETE FROM topic_subscribers WHERE topic_id = …` in one
   transaction, as `DELETE topics/{key}` did before, run from this process;
2. `DELETE topics/{key}` through the API with one real scheduler running: the request's time, the time
   until the scheduler has deleted the last membership and the topic's row, and the longest
   transaction of the scheduler's connection seen in pg_stat_activity (sampled every 20 ms: a lower
   bound of the true longest, by up to the interval). With `--kill-at F` the scheduler is killed with
   SIGKILL once F of the members are deleted, and a new one started: it resumes from the last chunk.

Checks (exit 1 when one fails): the topic's memberships and row are gone; every probe was delivered;
the longest scheduler transaction under 5 s. Figures on a shared machine move with its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from fanout_bench import Procs, fresh_database, percentile, probe_phase, warm_up  # noqa: E402

LONGEST_LIMIT_SECONDS = 5.0

_FILL = """INSERT INTO topic_subscribers (tenant_id, topic_id, subscriber, added_at)
SELECT %(tenant)s, %(topic)s, 'user-' || lpad(g::text, 8, '0'), now() FROM generate_series(1, %(n)s) g"""

# The scheduler's open transactions: (pid, xact_start) -> seconds open when sampled.
_OPEN = """SELECT pid, xact_start, extract(epoch FROM clock_timestamp() - xact_start)
FROM pg_stat_activity WHERE application_name LIKE 'omnipost-scheduler%%' AND xact_start IS NOT NULL"""


class TransactionSampler(threading.Thread):
    def __init__(self, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.seen: dict[tuple[int, object], float] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.stop_event.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(_OPEN)
                    for pid, started, seconds in cursor.fetchall():
                        key = (pid, started)
                        self.seen[key] = max(self.seen.get(key, 0.0), float(seconds))
                self.stop_event.wait(self.every)
        finally:
            connection.close()


def pickups(sent: dict[str, dict[str, float]], arrivals: dict[str, float], label: str) -> dict[str, object]:
    got = [arrivals[k] - t for k, t in sent[label].items() if k in arrivals]
    return {
        "p50_ms": round(statistics.median(got) * 1000, 1) if got else None,
        "p99_ms": round(percentile(got, 0.99) * 1000, 1) if got else None,
        "max_ms": round(max(got) * 1000, 1) if got else None,
        "n": len(got),
        "lost": len(sent[label]) - len(got),
    }


def fill(tenant_id: object, topic_id: int, members: int) -> float:
    from django.db import connection, transaction

    started = time.monotonic()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_FILL, {"tenant": tenant_id, "topic": topic_id, "n": members})
        cursor.execute("UPDATE topics SET subscriber_count = %s WHERE id = %s", [members, topic_id])
    return time.monotonic() - started


def main() -> int:  # noqa: C901, PLR0915
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url",
                        default="postgres://postgres:postgres@127.0.0.1:5432/omnipost_bench_topic_delete")  # fmt: skip
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--dispatchers", type=int, default=1)
    parser.add_argument("--idle-seconds", type=float, default=8.0)
    parser.add_argument("--kill-at", type=float, default=None)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument("--markdown")
    args = parser.parse_args()

    from benchmarks.receiver import ReceiverProcess
    from benchmarks.standalone import create_database, setup_django

    fresh_database(args.database_url)
    create_database(args.database_url)
    setup_django(args.database_url)
    from django.conf import settings
    from django.db import connection
    from rest_framework.test import APIClient

    from core.models import ApiKey, Tenant
    from providers.models import Provider
    from recipients.models import Topic

    receiver = ReceiverProcess(max_seconds=args.max_seconds + 600)
    tenant_a, tenant_b = Tenant.objects.create(name="broadcaster"), Tenant.objects.create(name="other")
    hooks = [
        Provider.objects.create(tenant=t, name="hook", kind="webhook", channel="webhook", is_default=True,
                                config={"url": receiver.url},
                                secrets={"signing_secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
        for t in (tenant_a, tenant_b)
    ]  # fmt: skip
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiKey.issue(tenant_a, name='bench')[1]}")
    keys = ["everyone"] + ([] if args.no_baseline else ["baseline"])
    for key in keys:
        assert api.put(f"/api/v1/topics/{key}", {"name": key}, format="json").status_code == 201
    results: dict[str, object] = {"members": args.members, "chunk": settings.OMNIPOST_TOPIC_DELETE_CHUNK,
                                  "kill_at": args.kill_at}  # fmt: skip
    for key in keys:
        seconds = fill(tenant_a.pk, Topic.objects.get(key=key).pk, args.members)
        print(f"filled {key}: {args.members:,} members in {seconds:.1f}s", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE topic_subscribers")

    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"topic-delete-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings_test", "DATABASE_URL": args.database_url}
    procs = Procs(env, logs)
    checks: dict[str, bool] = {}
    phases: dict[str, dict[str, dict[str, float]]] = {}
    try:
        for i in range(args.dispatchers):
            procs.start(f"dispatcher-{i}", "run_dispatcher", "--no-jitter")
        warm_up(tenant_b, hooks[1])
        phases["idle"] = probe_phase((tenant_a, tenant_b), hooks, None, args.idle_seconds)

        if not args.no_baseline:
            baseline = Topic.objects.get(key="baseline").pk
            done = threading.Event()
            took: list[float] = []

            def one_delete() -> None:
                from django.db import connection as own
                from django.db import transaction

                try:
                    started = time.monotonic()
                    with transaction.atomic(), own.cursor() as cursor:
                        cursor.execute("DELETE FROM topic_subscribers WHERE topic_id = %s", [baseline])
                    took.append(time.monotonic() - started)
                finally:
                    own.close()
                    done.set()

            threading.Thread(target=one_delete, daemon=True).start()
            phases["one DELETE"] = probe_phase((tenant_a, tenant_b), hooks, None, args.max_seconds,
                                               stop_when=done.is_set)  # fmt: skip
            results["one_delete_seconds"] = round(took[0], 2)
            print(f"one DELETE of {args.members:,} memberships: {took[0]:.1f}s in one transaction", flush=True)

        procs.start("scheduler-1", "run_scheduler", "--no-jitter")
        time.sleep(2.0)
        sampler = TransactionSampler()
        sampler.start()
        topic = Topic.objects.get(key="everyone")
        started = time.monotonic()
        response = api.delete("/api/v1/topics/everyone")
        answered = time.monotonic() - started
        assert response.status_code == 204, response.content
        gone: list[float] = []

        def finished() -> bool:
            procs.sample()
            if args.kill_at and "killed_at_members_left" not in results:
                left = Topic.objects.filter(pk=topic.pk).values_list("subscriber_count", flat=True).first() or 0
                if left <= (1 - args.kill_at) * args.members:
                    procs.kill9("scheduler-1")
                    results["killed_at_members_left"] = left
                    print(f"kill -9 of the scheduler with {left:,} members left", flush=True)
                    procs.start("scheduler-2", "run_scheduler", "--no-jitter")
            if not gone and not Topic.objects.filter(pk=topic.pk).exists():
                gone.append(time.monotonic() - started)
            return bool(gone)

        phases["chunked delete"] = probe_phase((tenant_a, tenant_b), hooks, None, args.max_seconds,
                                               stop_when=finished)  # fmt: skip
        sampler.stop_event.set()
        sampler.join(10)
        results["api_delete_ms"] = round(answered * 1000, 1)
        results["chunked_delete_seconds"] = round(gone[0], 2) if gone else None
        longest = max(sampler.seen.values(), default=0.0)
        results["scheduler_transactions_seen"] = len(sampler.seen)
        results["longest_scheduler_transaction_ms"] = round(longest * 1000, 1)
        print(f"API answered in {answered * 1000:.0f} ms; members gone after {gone[0] if gone else float('nan'):.1f}s;"
              f" longest scheduler transaction seen {longest * 1000:.0f} ms", flush=True)  # fmt: skip
        probes = [k for phase in phases.values() for sent in phase.values() for k in sent]
        from notifications.models import Notification

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not Notification.objects.filter(pk__in=probes).exclude(status="delivered").exists():
                break
            time.sleep(0.2)
        procs.sample()
    finally:
        procs.stop_all()
        final, arrivals = receiver.stop()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM topic_subscribers WHERE topic_id = %s", [topic.pk])
        left = cursor.fetchone()[0]
    results["memberships_left"] = left
    results["pickups"] = {
        phase: {label: pickups(sent, arrivals, label) for label in ("other", "own9")} for phase, sent in phases.items()
    }
    results["peak_rss_mib"] = {k: round(v, 1) for k, v in procs.peaks.items()}
    checks["the topic's memberships and row are gone"] = left == 0 and bool(gone)
    checks["every probe delivered"] = all(
        figures["lost"] == 0 for phase in results["pickups"].values() for figures in phase.values()
    )
    checks[f"longest scheduler transaction < {LONGEST_LIMIT_SECONDS:g} s"] = longest < LONGEST_LIMIT_SECONDS
    results["checks"] = checks
    print(json.dumps(results, indent=2, default=str))
    if args.markdown:
        lines = [f"| {k} | {'PASS' if v else 'FAIL'} |" for k, v in checks.items()]
        Path(args.markdown).write_text(
            "\n".join(["| check | result |", "|---|---|", *lines, "", "```json",
                       json.dumps(results, indent=2, default=str), "```", ""])  # fmt: skip
        )
    connection.close()
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
