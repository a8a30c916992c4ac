"""Figures for `GET queues`, `queue_stats` and the console dashboard, cheap at a million rows.

- `queue_figures()`: depth, ready, leased, delayed, oldest ready age and depth by priority per
  queue — ONE grouped query over queue_state, every time taken from the database clock so the
  figures agree with what the claim sees; exact up to SAMPLE_PAGES pages of queue_state, then
  counted over a random sample of that many pages and scaled (`queue_figures_sized()` says which),
  so a scrape or a dashboard costs the same with a backlog of ten million.
- `throughput()`: attempts per minute over the last hour by outcome — one grouped query over the
  last hour of delivery_attempts, served by attempt_finished_idx (BRIN, summarised by the janitor).
- `leased_notifications_sql()`: the notifications under a live lease, for the console's
  `dispatching` filter, read from the fronts of the claim's orders.
- `dlq_open()`: open dead letters, counted exactly up to a cap, then the planner's estimate.
- `estimated_rows()`: pg_class.reltuples, where an estimate serves (table sizes).
- `workers()`: the registry, live or stale by heartbeat.
- `CappedCountPaginator`: the admin changelists' count without COUNT(*) over a whole table.

Every function takes `tenant_ids` (None: every tenant, for superusers) so staff figures cover
only their tenants.
"""

from __future__ import annotations

import functools
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
from django.db.models import QuerySet
from django.utils import timezone

from queueing.models import Worker

TenantIds = Sequence[uuid.UUID] | None

PRIORITIES = range(10)


def scoped(qs: QuerySet, tenant_ids: TenantIds) -> QuerySet:
    return qs if tenant_ids is None else qs.filter(tenant_id__in=list(tenant_ids))


# --- queue depth ------------------------------------------------------------------------------------


# While queue_state holds at most EXACT_ROWS live items (the planner's estimate: pg_class's density
# times the file's current size) every item is counted; beyond, the figures come from a random
# sample of about SAMPLE_PAGES pages (8 KiB each, ~70 items a page), scaled up.
EXACT_ROWS = 50_000
SAMPLE_PAGES = 640

_SAMPLED_SQL = """
    WITH size AS (
        SELECT c.reltuples, pg_relation_size(c.oid) / current_setting('block_size')::int AS pages,
               c.relpages
        FROM pg_class c WHERE c.oid = 'queue_state'::regclass
    ), p AS (
        SELECT CASE WHEN (CASE WHEN relpages > 0 THEN reltuples / relpages * pages ELSE reltuples END) <= %s
                    THEN 100.0 ELSE least(100.0, 100.0 * %s / greatest(1, pages)) END AS pct
        FROM size
    ), g AS (
        SELECT queue_name, priority,
               count(*) AS depth,
               count(*) FILTER (WHERE available_at <= now() AND NOT leased) AS ready,
               count(*) FILTER (WHERE leased) AS leased,
               count(*) FILTER (WHERE available_at > now() AND NOT leased) AS delayed,
               extract(epoch FROM now() - min(enqueued_at) FILTER (WHERE available_at <= now() AND NOT leased))
                   AS oldest,
               min(pct) AS pct
        FROM (
            SELECT queue_name, priority, available_at, enqueued_at,
                   (lock_token IS NOT NULL AND locked_until > now()) AS leased, (SELECT pct FROM p) AS pct
            FROM queue_state TABLESAMPLE SYSTEM ((SELECT pct FROM p))
            {where}
        ) s
        GROUP BY queue_name, priority
    )
    -- A sample would miss the oldest item: for every tenant's figures, each sampled queue's oldest ready
    -- item is read exactly through queue_state_starving_idx (one index probe; none while exact).
    SELECT g.*, o.age
    FROM g LEFT JOIN LATERAL (
        SELECT extract(epoch FROM now() - enqueued_at) AS age FROM queue_state
        WHERE g.pct < 100 AND {all_tenants} AND ready AND NOT rate_limited AND queue_name = g.queue_name
          AND (locked_until IS NULL OR locked_until <= now())  -- a leased item stays in the index
        ORDER BY enqueued_at LIMIT 1
    ) o ON true
    ORDER BY g.queue_name, g.priority
"""


# Items under a live lease stay in the claim's indexes (a claim is a HOT update, queueing.queue), so no
# index finds them by their lease: they are where the claims took them, at the front of one of the
# claim's orders (a tenant's by priority or by age, a tenant's in one queue, a lane's). LEASE_FRONT items of each
# such front are read, a bound well above what the dispatchers hold of one tenant, queue or lane.
LEASE_FRONT = 2_000

_FRONT = """SELECT f.notification_id, f.tenant_id, f.lock_token, f.locked_until FROM {keys} CROSS JOIN LATERAL (
            SELECT notification_id, tenant_id, lock_token, locked_until FROM queue_state
            WHERE {where} ORDER BY {order} LIMIT {front}) f"""


def _skip_scan(name: str, column: str, where: str, order: str) -> str:
    """`name(id)`: each distinct `column` of the index ordered by `order` WHERE `where`, one descent each."""
    return f"""{name}(id) AS (
        (SELECT {column} FROM queue_state WHERE {where} AND {column} IS NOT NULL ORDER BY {order} LIMIT 1)
        UNION ALL
        SELECT (SELECT {column} FROM queue_state WHERE {where} AND {column} > {name}.id ORDER BY {order} LIMIT 1)
        FROM {name} WHERE {name}.id IS NOT NULL
    )"""  # noqa: S608 - fixed fragments


def leased_notifications_sql(cap: int, tenant_ids: TenantIds = None) -> tuple[str, list[Any]]:
    """A query of the ids of up to `cap` notifications whose queue item is under a live lease (by the
    database's clock), latest lease end first, of `tenant_ids` (None: every tenant): read from the
    first LEASE_FRONT items of each tenant (by priority and by age), each tenant in each queue and
    each lane, one index descent per key, whatever the backlog."""
    unlimited = "ready AND NOT rate_limited"
    all_queues = f"{unlimited} AND priority <= 9"  # names the per-tenant indexes (queueing.queue._ALL_QUEUES)
    tenant_order = "tenant_id, priority DESC, enqueued_at, item_id"
    queue_order = "queue_name, tenant_id, priority DESC, enqueued_at, item_id"
    lane_order = "provider_id, priority DESC, enqueued_at, item_id"
    front = functools.partial(_FRONT.format, front=int(LEASE_FRONT))
    # kt is one skip scan over the (queue, tenant) pair, one descent each, so the planner's estimate of
    # it stays that of one key's: a scan of tenants per queue multiplied two recursive estimates, and
    # that cost, charged to the caller's init plan, made PostgreSQL 15 plan the caller's table in
    # parallel instead of probing its primary key with these ids.
    sql = f"""
        WITH RECURSIVE {_skip_scan("t", "tenant_id", all_queues, tenant_order)},
        {_skip_scan("l", "provider_id", "ready AND rate_limited", lane_order)},
        -- each (queue, tenant): a claim for named queues takes the front of each
        kt(queue_name, tenant_id) AS (
            (SELECT queue_name, tenant_id FROM queue_state WHERE {unlimited} AND tenant_id IS NOT NULL
             ORDER BY {queue_order} LIMIT 1)
            UNION ALL
            SELECT s.queue_name, s.tenant_id FROM kt CROSS JOIN LATERAL (
                SELECT queue_name, tenant_id FROM queue_state
                WHERE {unlimited} AND (queue_name, tenant_id) > (kt.queue_name, kt.tenant_id)
                ORDER BY {queue_order} LIMIT 1) s
        ),
        fronts AS (
            {front(keys="t", where=f"{all_queues} AND tenant_id = t.id", order=tenant_order)}
            UNION ALL
            {front(keys="t", where=f"{all_queues} AND tenant_id = t.id", order="tenant_id, enqueued_at, item_id")}
            UNION ALL
            {front(keys="kt", where=f"{unlimited} AND queue_name = kt.queue_name AND tenant_id = kt.tenant_id",
                   order=queue_order)}
            UNION ALL
            {front(keys="l", where="ready AND rate_limited AND provider_id = l.id", order=lane_order)}
        )
        SELECT notification_id FROM fronts
        WHERE lock_token IS NOT NULL AND locked_until > now()
          AND (%s OR tenant_id = ANY(%s::uuid[]))
        GROUP BY notification_id
        ORDER BY max(locked_until) DESC
        LIMIT {int(cap)}"""  # noqa: S608 - fixed fragments and integers
    return sql, [tenant_ids is None, list(tenant_ids or [])]


def queue_figures(tenant_ids: TenantIds = None) -> list[dict[str, Any]]:
    """`GET queues` rows, by queue name: {queue, depth, ready, leased, delayed, oldest_age_seconds,
    by_priority: {"0": n, …, "9": n}}. Exact while queue_state is small, estimated beyond
    (see queue_figures_sized). One query."""
    return queue_figures_sized(tenant_ids)[0]


def queue_figures_sized(tenant_ids: TenantIds = None, using: str = "default") -> tuple[list[dict[str, Any]], bool]:
    """queue_figures() and whether they are exact. Up to about EXACT_ROWS items every item is counted;
    beyond, a random sample of SAMPLE_PAGES pages is counted and scaled, so a backlog of millions shows its
    size to a few per cent, a queue that holds a thousandth of the items may read 0 or a few hundred, and
    (for one tenant's figures) the oldest age is the oldest item of the sample, not of the queue."""
    if tenant_ids is not None and not tenant_ids:
        return [], True
    connection = connections[using]
    where, params = ("", [])
    if tenant_ids is not None:
        where, params = "WHERE tenant_id = ANY(%s::uuid[])", [list(tenant_ids)]
    sql = _SAMPLED_SQL.format(where=where, all_tenants="true" if tenant_ids is None else "false")
    with connection.cursor() as cursor:
        cursor.execute(sql, [EXACT_ROWS, SAMPLE_PAGES, *params])
        rows = cursor.fetchall()
    pct = float(rows[0][7]) if rows else 100.0
    exact = pct >= 100.0
    scale = 1.0 if exact else 100.0 / pct
    queues: dict[str, dict[str, Any]] = {}
    for name, priority, depth, ready, leased, delayed, oldest, _, probed in rows:
        queue = queues.setdefault(name, _empty(name))
        for key, n in (("depth", depth), ("ready", ready), ("leased", leased), ("delayed", delayed)):
            queue[key] += round(n * scale)
        queue["by_priority"][str(priority)] += round(depth * scale)
        for age in (oldest, probed):
            if age is not None:
                queue["oldest_age_seconds"] = round(max(queue["oldest_age_seconds"], float(age), 0.0), 3)
    return list(queues.values()), exact


def _empty(name: str) -> dict[str, Any]:
    return {"queue": name, "depth": 0, "ready": 0, "leased": 0, "delayed": 0, "oldest_age_seconds": 0.0,
            "by_priority": {str(p): 0 for p in PRIORITIES}}  # fmt: skip


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
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None


def planner_estimate(qs: QuerySet) -> int:
    """The planner's row estimate for `qs` (EXPLAIN, nothing is read)."""
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
    # The slice keeps the list's ordering, so the count walks the index that serves the page (at most
    # cap + 1 entries) instead of a sequential scan that stops after cap + 1 rows of whatever it meets.
    counted = qs[: cap + 1].count()
    if counted <= cap:
        return Size(counted, True)
    return Size(max(planner_estimate(qs), counted), False)


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
