"""A cancel of a topic fan-out's runs: how long `POST workflows/{key}/cancel` takes for all of them.

    .venv/bin/python bench/fanout_cancel_bench.py [--database-url URL] [--members 100000] [--named 1000]

On its own database (default `omnipost_fanoutcancel_bench` on the local server, dropped and created
afresh): a topic of `--members` is filled through the API, a workflow of one send step is triggered
to it with a cancellation key and fanned out to the end (narrow runs, none advanced), then
`workflows.services.cancel` is timed twice: first naming `--named` subscribers, then for the key's
every run (`--named 0`: only the latter). Exit 1 unless every run ends `cancelled` and the counts add up.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fanout_bench import fresh_database  # noqa: E402 - after the path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgres://postgres:postgres@127.0.0.1:5432/omnipost_fanoutcancel_bench")
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--named", type=int, default=1000)
    args = parser.parse_args()

    from benchmarks.standalone import create_database, setup_django

    fresh_database(args.database_url)
    create_database(args.database_url)
    setup_django(args.database_url)
    from django.db import connection
    from rest_framework.test import APIClient

    from core.models import ApiKey, Tenant
    from workflows import fanout, services
    from workflows.models import WorkflowRun

    tenant = Tenant.objects.create(name="broadcaster")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiKey.issue(tenant, name='bench')[1]}")
    steps = [{"name": "notice", "type": "send", "channel": "in_app", "subject": "Outage", "body": "down"}]
    assert api.post("/api/v1/workflows", {"key": "outage", "steps": steps}, format="json").status_code == 201
    assert api.put("/api/v1/topics/everyone", {"name": "Everyone"}, format="json").status_code == 201
    for start in range(0, args.members, 1000):
        ids = [f"user-{i:08d}" for i in range(start, min(start + 1000, args.members))]
        assert api.post("/api/v1/topics/everyone/subscribers", {"subscribers": ids}, format="json").status_code == 200
    body = {"topic": "everyone", "cancellation_key": "storm"}
    assert api.post("/api/v1/workflows/outage/trigger", body, format="json").status_code == 202
    started = time.monotonic()
    while fanout.chunk_once() is not None:
        pass
    fanned = time.monotonic() - started
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE workflow_runs")
    print(f"{WorkflowRun.objects.count():,} runs fanned out in {fanned:.2f}s", flush=True)

    named = [f"user-{i:08d}" for i in range(0, args.members, max(1, args.members // max(1, args.named)))]
    named = named[: args.named]
    some = 0
    if named:
        started = time.monotonic()
        some = services.cancel(tenant, "outage", "storm", subscribers=named, actor="bench")
        some_seconds = time.monotonic() - started
        print(f"cancel naming {len(named):,} subscribers: {some:,} runs in {some_seconds:.2f}s", flush=True)
    started = time.monotonic()
    rest = services.cancel(tenant, "outage", "storm", subscribers=None, actor="bench")
    rest_seconds = time.monotonic() - started
    print(f"cancel of the key's every run: {rest:,} runs in {rest_seconds:.2f}s", flush=True)
    statuses = set(WorkflowRun.objects.values_list("status", flat=True))
    ok = some == len(named) and some + rest == args.members and statuses == {"cancelled"}
    print("ok" if ok else f"FAILED: {some} + {rest} of {args.members}, statuses {statuses}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
