"""Workflow figures: triggers accepted per second (1 and 1,000 subscribers a call), run steps executed
per second by the scheduler with a send step, and a digest's cost per joined trigger (PostgreSQL).

    .venv/bin/python bench/workflows_bench.py [--repeats 3] [--database-url URL]

Everything runs in this one process against its own database (created and migrated, by default
`omnipost_workflows_bench`): `workflows.services.trigger` as the API calls it (without HTTP), and
`Scheduler.run_once` (what `run_scheduler` runs) until no workflow job is due. Medians of `--repeats`
runs; the tables are emptied between runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.standalone import create_database, setup_django  # noqa: E402

DEFAULT_URL = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_workflows_bench"


def _prepare(url: str) -> None:
    create_database(url)
    setup_django(url)


def _reset() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workflow_runs, workflow_digests, workflow_throttles, scheduled_jobs, queue_state, "
                       "notifications, subscribers CASCADE")  # fmt: skip


def _drain() -> int:
    from queueing.scheduler import Scheduler

    scheduler = Scheduler(jitter=0)
    total = 0
    while True:
        done = scheduler.run_once()
        if not scheduler.last.claimed:
            return total
        total += done


def _trigger(tenant, key: str, people: list[str], data: dict) -> None:  # noqa: ANN001
    from workflows import services

    services.trigger(tenant, key, subscribers=people, data=data, cancellation_key=None, trigger_actor=None,
                     actor="bench")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--database-url", default=os.environ.get("WORKFLOWS_BENCH_URL", DEFAULT_URL))
    args = parser.parse_args()
    _prepare(args.database_url)

    from core.models import Tenant
    from workflows.models import Workflow

    tenant, _ = Tenant.objects.get_or_create(name="workflows-bench")
    send = [{"name": "hello", "type": "send", "channel": "in_app", "subject": "Hi", "body": "Hello {{ data.n }}"}]
    digest = [{"name": "collect", "type": "digest", "window_seconds": 3600},
              {"name": "tell", "type": "send", "channel": "in_app", "body": "{{ digest.count }}"}]  # fmt: skip
    for key, steps in (("send", send), ("digest", digest)):
        Workflow.objects.update_or_create(tenant=tenant, key=key, defaults={"steps": steps})
    figures: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        _reset()
        started = time.perf_counter()
        for n in range(500):
            _trigger(tenant, "send", [f"solo-{n}"], {"n": n})
        figures.setdefault("triggers/s, 1 subscriber a call", []).append(500 / (time.perf_counter() - started))

        _reset()
        people = [f"user-{i}" for i in range(1000)]
        _trigger(tenant, "send", people, {"n": 0})  # the subscribers exist from here on
        _reset()
        started = time.perf_counter()
        for n in range(5):
            _trigger(tenant, "send", people, {"n": n})
        figures.setdefault("runs/s accepted, 1,000 subscribers a call", []).append(
            5000 / (time.perf_counter() - started)
        )

        started = time.perf_counter()
        advanced = _drain()
        assert advanced == 5000, advanced
        figures.setdefault("run steps/s (a send step each)", []).append(5000 / (time.perf_counter() - started))

        _reset()
        for n in range(1000):
            _trigger(tenant, "digest", ["jane"], {"n": n})
        started = time.perf_counter()
        assert _drain() == 1000
        figures.setdefault("digest: ms per joined trigger", []).append((time.perf_counter() - started) / 1000 * 1e3)
    for name, values in figures.items():
        print(f"{name}: median {statistics.median(values):.1f} (runs: {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
