"""/healthz (process up) and /readyz (database reachable, migrations applied)."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


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
    return checks


def readyz(request: HttpRequest) -> JsonResponse:
    checks = readiness_checks()
    ready = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ready" if ready else "not_ready", "checks": checks}, status=200 if ready else 503)
