"""Figures for `GET queues`, `queue_stats` and the console dashboard, cheap at a million rows.

- `queue_figures()`: depth, ready, leased, delayed, oldest ready age and depth by priority per
  queue — ONE grouped query over queue_state, every time taken from the database clock so the
  figures agree with what the claim sees (queue_state holds live items only, so it stays small
  next to notifications).
- `throughput()`: attempts per minute over the last hour by outcome — one grouped query over the
  last hour of delivery_attempts, served by attempt_finished_idx.
- `dlq_open()`: open dead letters, counted exactly up to a cap, then the planner's estimate.
- `estimated_rows()`: pg_class.reltuples, where an estimate serves (table sizes).
- `workers()`: the registry, live or stale by heartbeat.
- `CappedCountPaginator`: the admin changelists' count without COUNT(*) over a whole table.

Every function takes `tenant_ids` (None: every tenant, for superusers) so staff figures cover
only their tenants.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Any

from django.conf import settings
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Count, DurationField, ExpressionWrapper, Min, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from queueing.models import LEASED, QueueItem, Worker

TenantIds = Sequence[uuid.UUID] | None

_READY = Q(available_at__lte=Now()) & ~LEASED
_DELAYED = Q(available_at__gt=Now()) & ~LEASED
PRIORITIES = range(10)


def scoped(qs: QuerySet, tenant_ids: TenantIds) -> QuerySet:
    return qs if tenant_ids is None else qs.filter(tenant_id__in=list(tenant_ids))


# --- queue depth ------------------------------------------------------------------------------------


def queue_figures(tenant_ids: TenantIds = None) -> list[dict[str, Any]]:
    """`GET queues` rows, by queue name: {queue, depth, ready, leased, delayed, oldest_age_seconds,
    by_priority: {"0": n, …, "9": n}}. One query."""
    rows = (
        scoped(QueueItem.objects.all(), tenant_ids)
        .values("queue_name", "priority")
        .annotate(
            depth=Count("pk"),
            ready=Count("pk", filter=_READY),
            leased=Count("pk", filter=LEASED),
            delayed=Count("pk", filter=_DELAYED),
            oldest_age=ExpressionWrapper(Now() - Min("enqueued_at", filter=_READY), output_field=DurationField()),
        )
        .order_by("queue_name", "priority")
    )
    queues: dict[str, dict[str, Any]] = {}
    for row in rows:
        queue = queues.setdefault(
            row["queue_name"],
            {
                "queue": row["queue_name"], "depth": 0, "ready": 0, "leased": 0, "delayed": 0,
                "oldest_age_seconds": 0.0, "by_priority": {str(p): 0 for p in PRIORITIES},
            },
        )  # fmt: skip
        for name in ("depth", "ready", "leased", "delayed"):
            queue[name] += row[name]
        queue["by_priority"][str(row["priority"])] += row["depth"]
        if row["oldest_age"] is not None:
            age = max(0.0, row["oldest_age"].total_seconds())
            queue["oldest_age_seconds"] = round(max(queue["oldest_age_seconds"], age), 3)
    return list(queues.values())


def totals(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of every queue added up (oldest age: the oldest of all)."""
    out: dict[str, Any] = {"depth": 0, "ready": 0, "leased": 0, "delayed": 0, "oldest_age_seconds": 0.0}
    by_priority = {str(p): 0 for p in PRIORITIES}
    for q in figures:
        for name in ("depth", "ready", "leased", "delayed"):
            out[name] += q[name]
        out["oldest_age_seconds"] = max(out["oldest_age_seconds"], q["oldest_age_seconds"])
        for p, n in q["by_priority"].items():
            by_priority[p] += n
    out["by_priority"] = by_priority
    return out


# --- sizes ----------------------------------------------------------------------------------------------


def estimated_rows(table: str, using: str = "default") -> int | None:
    """pg_class.reltuples for `table` (kept fresh by autovacuum/ANALYZE); None where unknown."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None


def planner_estimate(qs: QuerySet) -> int | None:
    """The planner's row estimate for `qs` (EXPLAIN, nothing is read); None off PostgreSQL."""
    if connections[qs.db].vendor != "postgresql":
        return None
    plan = json.loads(qs.order_by().explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


@dataclass(frozen=True, slots=True)
class Size:
    count: int
    exact: bool  # False: at least `cap` rows, `count` is an estimate

    def __str__(self) -> str:
        return f"{self.count:,}" if self.exact else f"≈{self.count:,}"


def capped_count(qs: QuerySet, cap: int = 10_000) -> Size:
    """Exact up to `cap` (one COUNT over at most cap+1 rows), else the planner's estimate."""
    counted = qs.order_by()[: cap + 1].count()
    if counted <= cap:
        return Size(counted, True)
    estimate = planner_estimate(qs)
    return Size(max(estimate or 0, counted), False)


# --- workers ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerRow:
    worker: Worker
    alive: bool
    seen_seconds_ago: float


def workers(limit: int = 50) -> list[WorkerRow]:
    """Running processes (not stopped), most recently seen first, flagged live or stale. One query."""
    stale = timedelta(seconds=float(settings.OMNIPOST_WORKER_STALE_SECONDS))
    now = timezone.now()
    rows = Worker.objects.filter(stopped_at__isnull=True).order_by("-last_seen")[:limit]
    return [WorkerRow(w, now - w.last_seen < stale, max(0.0, (now - w.last_seen).total_seconds())) for w in rows]


# --- admin pagination -------------------------------------------------------------------------------------


class CappedCountPaginator(Paginator):
    """Counts exactly up to `cap` rows, then uses the planner's estimate: a changelist over a
    million rows never runs COUNT(*) over the whole table."""

    cap = 10_000

    @cached_property
    def count(self) -> int:
        return capped_count(self.object_list, self.cap).count
