"""Ops endpoints without tenant auth: /healthz (process up), /readyz (ready to serve) and /metrics
(`omnipost_site.ops.metrics`, re-exported here so the URLconf routes all three from one module).

/readyz is `503` when the database is unreachable, migrations are unapplied, or the oldest due
scheduled job has waited longer than OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS (default 60; 0 turns
that check into a report only). Stale workers — registered dispatchers/schedulers whose heartbeat
is older than OMNIPOST_WORKER_STALE_SECONDS — are counted (by kind) as a warning and never make it
503: a killed worker's leases expire by themselves, and taking web processes out of rotation would
not bring it back. /readyz answers without authentication, so it shows counts only: which host and
pid went quiet is for operators, in `queue_stats --json` and the admin's Workers page.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse

from omnipost_site.ops.metrics import metrics  # noqa: F401 - routed as /metrics

DEFAULT_MAX_SCHEDULER_LAG = 60.0
WORKER_KINDS = ("dispatcher", "scheduler")


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def max_scheduler_lag() -> float:
    """OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS (0: off)."""
    return max(0.0, float(settings.OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS))


def readiness_checks() -> dict[str, str]:
    checks: dict[str, str] = {}
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"unreachable: {type(exc).__name__}"
        return checks
    executor = MigrationExecutor(connection)
    pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    checks["migrations"] = "ok" if not pending else f"{len(pending)} unapplied"
    if pending:
        return checks  # the tables below may not exist yet
    checks["scheduler"] = _scheduler_check()
    return checks


def _scheduler_check() -> str:
    from queueing.scheduler import next_due

    try:
        _, seconds = next_due()
    except DatabaseError as exc:
        return f"unreadable: {type(exc).__name__}"
    lag = max(0.0, -seconds) if seconds is not None else 0.0
    limit = max_scheduler_lag()
    if limit and lag > limit:
        return f"lagging: the oldest due job waits {lag:.0f}s (limit {limit:g}s)"
    return "ok"


def worker_report() -> dict[str, Any]:
    """Live and stale worker counts, the stale ones by kind: no host, pid or other name of a process."""
    from queueing import stats

    rows = stats.workers(limit=10_000)
    stale_by_kind = dict.fromkeys(WORKER_KINDS, 0)
    for r in rows:
        if not r.alive:
            stale_by_kind[r.worker.kind] = stale_by_kind.get(r.worker.kind, 0) + 1
    return {
        "live": sum(1 for r in rows if r.alive),
        "stale": sum(stale_by_kind.values()),
        "stale_by_kind": stale_by_kind,
    }


def readyz(request: HttpRequest) -> JsonResponse:
    checks = readiness_checks()
    ready = all(v == "ok" for v in checks.values())
    body: dict[str, Any] = {"status": "ready" if ready else "not_ready", "checks": checks}
    if checks.get("migrations") == "ok":
        try:
            workers = worker_report()
        except DatabaseError as exc:
            workers = {"error": type(exc).__name__}
        body["workers"] = workers
        body["warnings"] = []
        if workers.get("stale"):
            body["warnings"] = [
                f"{workers['stale']} stale worker(s): no heartbeat for over "
                f"{settings.OMNIPOST_WORKER_STALE_SECONDS:g}s (their leases expire by themselves)"
            ]
    return JsonResponse(body, status=200 if ready else 503)
