"""The queue API every other part uses: enqueue, claim, ack, release, extend, lock and remove.

The one module that writes `queue_state` (tests/queueing/test_one_place.py checks it): every INSERT,
UPDATE and DELETE is here, as a function or as a SQL fragment (`insert_items_sql`, …) that the
scheduler's promotion and the dispatcher's record statement compose.

Each operation is a fixed number of SQL statements per call, whatever the number of items, and
all times come from the database's clock (`now()`), so clock skew between machines never matters.
A claim hands each item to exactly one claimer through `FOR UPDATE SKIP LOCKED` inside one
`UPDATE … RETURNING`.

Every claim gets a fresh `lock_token`; ack, release and extend only touch rows whose
(item_id, lock_token) still match, so a worker whose lease expired and was re-claimed (a zombie)
changes nothing and learns which items it lost from the returned ids.

Ready and waiting items are kept apart (River's and Oban's `available` vs `scheduled`): `ready`
is true for items due now, leased or not. A delayed release or enqueue takes the item out of the
ready set; `stage()` (the dispatcher runs it every `STAGE_SECONDS`) brings back those whose
`available_at` has passed. The claim's partial indexes hold ready items only, one of them led by
`queue_name`, so a claim costs the same whatever waits for later or in other queues.

A claim writes only columns no index reads (`lock_token`, `locked_until`, `attempts`), so its new
row version is a HOT update: on the same page (queue_state's fillfactor leaves room) and in no
index. A leased item therefore stays in the ready indexes, and every claim steps over the items in
flight ahead of it (`_FREE`, checked on the row): a cost bounded by what the dispatchers hold, not
by any queue's depth. An expired lease is claimable again at once, by the database's clock, with
no staging; extending and giving back untried are HOT too.

Raw SQL lives here because the ORM cannot express the claim (CTE + SKIP LOCKED + RETURNING).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connections

from queueing import ratelimit, ringer

NOTIFY_CHANNEL = "omnipost_queue"


@dataclass(slots=True)
class NewItem:
    notification_id: uuid.UUID
    tenant_id: uuid.UUID
    provider_id: int | None
    queue_name: str = "default"
    priority: int = 5
    payload: dict[str, Any] = field(default_factory=dict)
    delay_seconds: float = 0.0
    # Whether the item is rate-limited is not the caller's to say: the enqueue decides from the
    # provider's and tenant's limits as they are (ratelimit.limited_sql).


@dataclass(slots=True)
class Lease:
    item_id: int
    lock_token: uuid.UUID
    notification_id: uuid.UUID
    tenant_id: uuid.UUID
    provider_id: int | None
    queue_name: str
    priority: int
    payload: dict[str, Any]
    attempts: int
    enqueued_at: datetime
    locked_until: datetime
    rate_limited: bool


_RETURNING = (
    "item_id, lock_token, notification_id, tenant_id, provider_id, queue_name, priority, payload_json, attempts, "
    "enqueued_at, locked_until, rate_limited"
)


_SCALAR_TYPES = (str, int, float, bool, type(None))


class LeaseReader:
    """Leases from the rows of one `claim` (the dispatcher reads fewer columns, see
    `dispatch.delivery.DispatchLease`), where psycopg already gives UUIDs and aware datetimes: positional
    construction, and each distinct flat payload text parsed once per claim (a claim's payloads are
    nearly all alike, e.g. {"channel": "webhook"}); every lease still gets its own dict."""

    __slots__ = ("_flat",)

    def __init__(self) -> None:
        self._flat: dict[str, dict[str, Any]] = {}

    def __call__(self, row: Sequence[Any]) -> Lease:
        payload = row[7]  # text from Django's connection, already a dict from a plain psycopg one
        if isinstance(payload, str):
            flat = self._flat.get(payload)
            if flat is not None:
                payload = flat.copy()
            else:
                text, payload = payload, json.loads(payload)
                if type(payload) is dict and all(type(v) in _SCALAR_TYPES for v in payload.values()):
                    self._flat[text] = payload.copy()
        return Lease(row[0], row[1], row[2], row[3], row[4], row[5], row[6], payload, row[8], row[9], row[10], row[11])


def ring_after_commit(channel: str, payload: str, using: str = "default", *, connection: Any = None) -> None:  # noqa: ANN401
    """NOTIFY listeners once the caller's transaction commits (at once in autocommit).

    Not inside the transaction: PostgreSQL serialises the commits of every transaction that
    sent a NOTIFY (a global lock held through the commit's fsync), which capped concurrent API
    writers at a few hundred commits a second. Not on the caller's connection either: the
    process's ringer thread sends it (queueing.ringer), coalesced with the other rings since its
    last statement, so the request costs no round trip for it. A rolled-back transaction still
    wakes no one; a lost wake-up costs at most one polling interval. `connection`: the caller's
    Django connection for `using`, if it has it (saves looking it up again).
    """
    conn = connections[using] if connection is None else connection  # the caller's, when it has it at hand
    conn.on_commit(functools.partial(ringer.ring, channel, payload, conn.alias))


# --- enqueue ---------------------------------------------------------------------------------------
def insert_items_sql(source: str, *, order_by: str = "") -> str:
    """`INSERT INTO queue_state … SELECT` of new items from `source`, a FROM item
    (aliased `s`) with the columns queue_name, priority, payload (jsonb), delay (seconds, float8),
    tenant_id, notification_id, provider_id. The one place new items get their `rate_limited`
    (from the current limits: the lane's row of `lane_limits` and the tenant's) and their `ready`;
    `enqueue` and the promotion of scheduled jobs use it.
    Ends in ON CONFLICT (notification_id) DO NOTHING, for the caller to add RETURNING."""
    limited = ratelimit.limited_sql("lim_p", "lim_t")
    return f"""
        INSERT INTO queue_state (queue_name, priority, payload_json, enqueued_at, available_at, attempts,
                                 tenant_id, notification_id, provider_id, rate_limited, ready)
        SELECT s.queue_name, s.priority, s.payload, now() + s.delay * interval '1 second',
               now() + s.delay * interval '1 second', 0, s.tenant_id, s.notification_id, s.provider_id,
               -- an item without a provider has no lane to go through
               coalesce(s.provider_id IS NOT NULL AND {limited}, false), s.delay <= 0
        FROM {source}
        LEFT JOIN lane_limits lim_p ON lim_p.lane_id = s.provider_id
        LEFT JOIN tenants lim_t ON lim_t.id = s.tenant_id
        {f"ORDER BY {order_by}" if order_by else ""}
        ON CONFLICT (notification_id) DO NOTHING"""


_ENQUEUE = insert_items_sql(
    """(SELECT q AS queue_name, p AS priority, pl::jsonb AS payload, greatest(d, 0) AS delay, t AS tenant_id,
               n AS notification_id, pr AS provider_id, ord
        FROM unnest(%s::text[], %s::int[], %s::text[], %s::float8[], %s::uuid[], %s::uuid[], %s::bigint[])
            WITH ORDINALITY AS u(q, p, pl, d, t, n, pr, ord)) s""",
    order_by="s.ord",  # item ids in the caller's order: claims take ties first inserted first
)


def enqueue(items: Sequence[NewItem], *, using: str = "default") -> int:
    """Insert items in the caller's transaction; a notification already queued is skipped.

    Idle workers are rung (NOTIFY) once the transaction commits, so a rolled-back enqueue wakes no
    one and leaves nothing behind.
    Returns how many items were inserted.
    """
    if not items:
        return 0
    with connections[using].cursor() as cursor:
        cursor.execute(
            _ENQUEUE,
            [
                [i.queue_name for i in items],
                [i.priority for i in items],
                [json.dumps(i.payload) for i in items],
                [float(i.delay_seconds) for i in items],
                [i.tenant_id for i in items],
                [i.notification_id for i in items],
                [i.provider_id for i in items],
            ],
        )
        inserted = cursor.rowcount
    ring_after_commit(NOTIFY_CHANNEL, ",".join(sorted({i.queue_name for i in items})), using)
    return inserted


# --- claim -----------------------------------------------------------------------------------------
def claim(
    n: int,
    *,
    lease_seconds: float | None = None,
    queues: Sequence[str] | None = None,
    lanes: Mapping[int, int] | None = None,
    starvation_seconds: float | None = None,
    using: str = "default",
    leave_out: Sequence[str] = (),
) -> list[Lease]:
    """Lease up to `n` ready items, highest priority first, then oldest; items older than the
    starvation threshold first of all (oldest first). An expired lease counts as ready.
    None of the tenants in `leave_out` (tenant ids) is taken from (over all queues only).

    `lanes` maps a rate-limited provider id to how many of its items may be taken (the tokens
    already granted); rate-limited items are never taken otherwise.
    Two statements: `stage()`, then the claim (the dispatcher stages on its own schedule and
    composes `claim_ctes` itself).
    """
    lease = float(settings.OMNIPOST_LEASE_SECONDS if lease_seconds is None else lease_seconds)
    starve = float(settings.OMNIPOST_STARVATION_SECONDS if starvation_seconds is None else starvation_seconds)
    lanes = {pid: cap for pid, cap in (lanes or {}).items() if cap > 0}
    if n <= 0 and not lanes:
        return []
    token = uuid.uuid4()
    stage(using=using)
    rows = _claim(max(n, 0), lease, starve, list(queues) if queues else None, lanes, token, using, leave_out)
    leases = list(map(LeaseReader(), rows))
    leases.sort(key=lambda x: (-x.priority, x.enqueued_at, x.item_id))  # ties: first enqueued first
    return leases


# Not under a live lease, by the database's clock: checked on the row, never in an index (a claim that
# changed an indexed column would write a new entry into every index of queue_state). Release and
# give-back clear lock_token and locked_until together, so a null locked_until means no lease.
_FREE = "(locked_until IS NULL OR locked_until <= now())"
# What a claimable, unlimited item is to the main claim: the predicate of its partial indexes
# (queue_state_ready_idx, queue_state_queue_tenant_idx, queue_state_tenant_idx and the aged ones), then
# the lease. `available_at <= now()` holds for every staged item and guards rows inserted by hand with
# a later available_at.
_READY_UNLIMITED = f"ready AND NOT rate_limited AND available_at <= now() AND {_FREE}"
# Always true (the priority check constraint): names the per-tenant indexes over all queues
# (queue_state_tenant_idx, queue_state_tenant_aged_idx), whose predicate has it, so that a claim for
# named queues, which does not say it, cannot read them (stepping over the tenant's items of every
# other queue by filter) instead of queue_state_queue_tenant_idx.
_ALL_QUEUES = "priority <= 9"


def claim_ctes(
    n: int,
    lease: float,
    starve: float | None,
    queues: list[str] | None,
    lanes: dict[int, int],
    token: uuid.UUID,
    *,
    returning: str = _RETURNING,
    leave_out: Sequence[str] = (),
) -> tuple[str, dict[str, Any]]:
    """The claim as CTEs ending in `claimed AS (UPDATE queue_state … RETURNING <returning>)`, so
    callers can extend the same single statement (the dispatcher joins the notifications to it and
    returns fewer columns). `starve=None` leaves out the starving branch (and its index scan).
    Only ready items not under a live lease are read (see `stage` and `_FREE`); the claim leaves them
    in the ready set (a HOT update), leased. Weighted-fair between tenants over all queues or over
    the named `queues` alike (`_fair_claim_ctes`).
    `leave_out`: tenant ids whose items this claim does not take (a dispatcher's claim for its
    spare slots, dispatch.dispatcher).

    The update finds the rows it locked by their `ctid` (a TID scan: no index descent, and no plan
    to misjudge). Joined on `item_id` instead, the planner hash-joined a sequential scan of the
    whole queue once it held fewer than ≈ 30,000 rows (7 ms for a claim of 250 at 20,000). The
    rows are locked (FOR UPDATE) by this statement, so their ctids cannot change before it ends."""
    return _fair_claim_ctes(
        n, lease, starve, lanes, token, returning=returning, leave_out=leave_out, queues=queues or None
    )


def _picked_and_claimed(lane_union: str, returning: str) -> str:
    """The claim's last two CTEs: what was picked (`picked_main`, plus the lanes) is leased."""
    return f"""picked AS (
            SELECT item_id, ctid FROM picked_main {lane_union}
        ), claimed AS (
            -- only columns no index reads: a HOT update (see the module's docstring)
            UPDATE queue_state q
            SET lock_token = %(token)s,
                locked_until = now() + %(lease)s * interval '1 second',
                attempts = q.attempts + 1
            WHERE q.ctid = ANY(ARRAY(SELECT ctid FROM picked))
            RETURNING {", ".join("q." + c.strip() for c in returning.split(","))}
        )"""


def _lanes_cte(queue_filter: str) -> str:
    return f"""lanes AS (
            SELECT l.item_id, l.ctid FROM unnest(%(lane_ids)s::bigint[], %(lane_caps)s::int[]) AS k(provider_id, cap)
            CROSS JOIN LATERAL (
                SELECT item_id, ctid FROM queue_state
                WHERE ready AND rate_limited AND provider_id = k.provider_id AND available_at <= now() AND {_FREE}
                  {queue_filter}
                ORDER BY priority DESC, enqueued_at, item_id
                LIMIT k.cap
                FOR UPDATE SKIP LOCKED
            ) l
        )"""


def _fair_claim_ctes(
    n: int, lease: float, starve: float | None, lanes: dict[int, int], token: uuid.UUID, *, returning: str,
    leave_out: Sequence[str] = (), queues: list[str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """`claim_ctes`: weighted-fair between tenants, over all queues or the named `queues`, still one
    statement.

    - `active`: the tenants with ready unlimited items, by a recursive skip-scan (one index descent
      per tenant, whatever their depth): of queue_state_tenant_idx over all queues; of
      queue_state_queue_tenant_idx once per named queue (led by queue_name, so another queue's depth
      costs nothing). Joined to `tenants` for their `weight`.
    - `fair`: one LATERAL per tenant takes its share of the batch, ceil(n · weight / Σ weights), in
      its own order: priority DESC, enqueued_at (and, when `starve` is given, its items past the
      starvation age first: aging reorders a tenant's own work, it never outranks another tenant).
      With named queues, one LATERAL per tenant and queue, each stopped at the share, merged in that
      order (a tenant in k of the named queues may lock up to k − 1 shares it does not take, until the
      statement ends). Each of a tenant's items gets a turn, (rank − 1 + phase) / weight: the batch is
      the lowest turns, so tenants interleave weighted round-robin and a tenant marking everything 9
      gains nothing. `phase` is drawn per tenant and claim: a busy dispatcher claims as slots free up,
      often one item at a time, and a fixed tie-break would hand every such claim to one tenant.
    - `topup` (over all queues only): what the shares left unfilled (tenants with fewer ready items
      than their share) goes to the highest priorities of any tenant (queue_state_ready_idx);
      one-time filters skip its scan whenever the shares filled the batch or one tenant alone is
      active (its share is the whole batch, so there is nothing more to find: the path of a single
      rung notification). With named queues there is none: a claim the shares left short is
      followed by the next, where the tenants that ran dry are no longer active.
    Rows are locked as they are read (FOR UPDATE SKIP LOCKED); a peer's claim in flight is skipped,
    never waited for.
    With `leave_out`, those tenants get no share and there is no `topup` (it reads the all-tenant
    index, where the tenants left out are the ones that fill it)."""
    by_priority_order = "priority DESC, enqueued_at, item_id"
    # The named queues as a VALUES list, not unnest() of an array: the planner then knows how many
    # there are (it guesses ten for an array parameter, and the estimate of the claim's cost crossed
    # jit_above_cost under its generic plan). A dispatcher's queues are fixed: one statement text.
    named = "(VALUES {})".format(", ".join(f"(%(queue_{i})s::text)" for i in range(len(queues or ()))))

    def per_tenant(name: str, where: str, order_by: str, queue_order: str = by_priority_order) -> str:
        # The inner LIMIT is a constant for the planner's sake (with `LIMIT s.share` alone it guesses a
        # tenth of the queue per tenant, and the plan's cost crosses jit_above_cost: ≈ 50–100 ms of JIT
        # compilation per claim); the outer `LIMIT s.share` is what stops the scan, and the locking.
        if queues:  # a tenant's items in each named queue, read in the order of the index led by it
            source = f"""SELECT c.item_id, c.ctid, c.priority, c.enqueued_at
                FROM {named} AS k(queue_name) CROSS JOIN LATERAL (
                    SELECT * FROM (
                        SELECT item_id, ctid, priority, enqueued_at FROM queue_state
                        WHERE {where} AND queue_name = k.queue_name AND tenant_id = s.tenant_id
                        ORDER BY queue_name, {queue_order}
                        LIMIT %(n)s
                        FOR UPDATE SKIP LOCKED
                    ) candidates
                    LIMIT s.share
                ) c"""
        else:
            source = f"""SELECT * FROM (
                    SELECT item_id, ctid, priority, enqueued_at FROM queue_state
                    WHERE {where} AND tenant_id = s.tenant_id AND {_ALL_QUEUES}
                    ORDER BY tenant_id, {order_by}
                    LIMIT %(n)s
                    FOR UPDATE SKIP LOCKED
                ) candidates
                LIMIT s.share"""
        return f"""{name} AS (
            SELECT s.tenant_id, s.weight, s.phase, s.share, l.item_id, l.ctid,
                   row_number() OVER (PARTITION BY s.tenant_id ORDER BY {order_by}) AS pos
            FROM shares s CROSS JOIN LATERAL (
                {source}
            ) l
        )"""

    # Without `priority >= 0`, as queue_state_tenant_idx is: the planner then cannot read queue_state_ready_idx
    # for a tenant (with statistics taken while one tenant filled the queue, it did, stepping over every
    # other tenant's items by filter: 47,000 rows and ≈ 20 ms for a claim of one quiet tenant's item).
    by_priority = per_tenant("ranked", _READY_UNLIMITED, by_priority_order, f"tenant_id, {by_priority_order}")
    if starve is None:
        fair = f"""{by_priority}, fair AS (
            SELECT item_id, ctid, (pos - 1 + phase) / weight AS turn FROM ranked
            WHERE pos <= share  -- named queues: a share from each queue, the tenant's first `share` of them
        )"""
    else:
        # Without `priority >= 0`, so that the planner reads queue_state_tenant_aged_idx (see models). With
        # named queues, a queue's aged items oldest first (queue_state_starving_idx, bounded by the age):
        # what the tenant's scan steps over is other tenants' aged items of that queue, never newer ones.
        aged = per_tenant(
            "aged", f"{_READY_UNLIMITED} AND enqueued_at <= now() - %(starve)s * interval '1 second'",
            "enqueued_at, item_id", "enqueued_at, item_id",
        )
        fair = f"""{aged}, {by_priority}, fair AS (
            -- a tenant's aged items first, then by priority; the branches may overlap, hence DISTINCT
            SELECT item_id, ctid, (rank - 1 + phase) / weight AS turn FROM (
                SELECT item_id, ctid, weight, phase, share,
                       row_number() OVER (PARTITION BY tenant_id ORDER BY branch, pos) AS rank
                FROM (
                    SELECT DISTINCT ON (item_id) * FROM (
                        SELECT *, 0 AS branch FROM aged UNION ALL SELECT *, 1 AS branch FROM ranked
                    ) both_branches
                    ORDER BY item_id, branch, pos
                ) distinct_items
            ) mine
            WHERE rank <= share
        )"""
    lane_cte = f", {_lanes_cte('AND queue_name = ANY(%(queues)s)' if queues else '')}" if lanes else ""
    lane_union = "UNION ALL SELECT item_id, ctid FROM lanes" if lanes else ""
    left_out = " WHERE a.tenant_id <> ALL(%(leave_out)s::uuid[])" if leave_out else ""
    no_topup = "false AND " if leave_out or queues else ""
    ready_q = """q.ready AND NOT q.rate_limited AND q.available_at <= now()
                      AND (q.locked_until IS NULL OR q.locked_until <= now())"""
    if queues:
        # ordered as queue_state_queue_tenant_idx is: one descent per (queue, tenant)
        active = f"""active(queue_name, tenant_id) AS (
            SELECT k.queue_name,
                   (SELECT q.tenant_id FROM queue_state q WHERE {ready_q} AND q.queue_name = k.queue_name
                    ORDER BY q.queue_name, q.tenant_id, q.priority DESC, q.enqueued_at, q.item_id LIMIT 1)
            FROM {named} AS k(queue_name)
            UNION ALL
            SELECT a.queue_name,
                   (SELECT q.tenant_id FROM queue_state q
                    WHERE {ready_q} AND q.queue_name = a.queue_name AND q.tenant_id > a.tenant_id
                    ORDER BY q.queue_name, q.tenant_id, q.priority DESC, q.enqueued_at, q.item_id LIMIT 1)
            FROM active a WHERE a.tenant_id IS NOT NULL
        )"""
        tenants_active = "(SELECT DISTINCT tenant_id FROM active WHERE tenant_id IS NOT NULL) a"
    else:
        active = f"""active(tenant_id) AS (
            -- ordered as queue_state_tenant_idx is, so that it is the index read (not the tenant FK's);
            -- without `priority >= 0`, so that queue_state_ready_idx is not among those it may read here
            (SELECT tenant_id FROM queue_state WHERE {_READY_UNLIMITED} AND {_ALL_QUEUES}
             ORDER BY tenant_id, priority DESC, enqueued_at, item_id LIMIT 1)
            UNION ALL
            SELECT (SELECT q.tenant_id FROM queue_state q
                    WHERE {ready_q} AND q.tenant_id > a.tenant_id AND q.{_ALL_QUEUES}
                    ORDER BY q.tenant_id, q.priority DESC, q.enqueued_at, q.item_id LIMIT 1)
            FROM active a WHERE a.tenant_id IS NOT NULL
        )"""
        tenants_active = "active a"
    ctes = f"""
        WITH RECURSIVE {active}, shares AS (
            SELECT a.tenant_id, t.weight::float8 AS weight, random() AS phase,
                   ceil(%(n)s * t.weight::float8 / sum(t.weight) OVER ())::int AS share
            FROM {tenants_active} JOIN tenants t ON t.id = a.tenant_id{left_out}
        ), {fair}, topup AS (
            SELECT item_id, ctid FROM queue_state
            -- one-time gates: only when the shares left room and another tenant may have more than its
            -- share (with one tenant active its share is the whole claim: nothing is left to find)
            WHERE {no_topup}(SELECT count(*) FROM fair) < %(n)s AND (SELECT count(*) FROM shares) > 1
              AND {_READY_UNLIMITED} AND priority >= 0
            ORDER BY priority DESC, enqueued_at, item_id
            LIMIT %(n)s
            FOR UPDATE SKIP LOCKED
        ), picked_main AS (
            SELECT item_id, ctid FROM (
                SELECT DISTINCT ON (item_id) item_id, ctid, branch, turn FROM (
                    SELECT item_id, ctid, 0 AS branch, turn FROM fair
                    UNION ALL
                    SELECT item_id, ctid, 1 AS branch, row_number() OVER ()::float8 AS turn FROM topup
                ) both_branches
                ORDER BY item_id, branch, turn
            ) distinct_items
            ORDER BY branch, turn
            LIMIT %(n)s
        ){lane_cte}, {_picked_and_claimed(lane_union, returning)}"""
    params: dict[str, Any] = {
        "n": n, "starve": starve, "lease": lease, "token": token, "leave_out": list(leave_out), "queues": queues,
        **{f"queue_{i}": name for i, name in enumerate(queues or ())},
    }  # fmt: skip
    if lanes:
        params["lane_ids"] = list(lanes.keys())
        params["lane_caps"] = list(lanes.values())
    return ctes, params


def _claim(
    n: int, lease: float, starve: float, queues: list[str] | None, lanes: dict[int, int], token: uuid.UUID, using: str,
    leave_out: Sequence[str] = (),
) -> list[tuple]:
    ctes, params = claim_ctes(n, lease, starve, queues, lanes, token, leave_out=leave_out)
    with connections[using].cursor() as cursor:
        cursor.execute(f"{ctes} SELECT {_RETURNING} FROM claimed", params)
        return cursor.fetchall()


# --- ack / release / extend (fenced by lock_token) ------------------------------------------------
def _pairs(leases: Iterable[Lease]) -> tuple[list[int], list[uuid.UUID]]:
    ids, tokens = [], []
    for lease in leases:
        ids.append(lease.item_id)
        tokens.append(lease.lock_token)
    return ids, tokens


def ack(leases: Sequence[Lease], *, using: str = "default") -> set[int]:
    """Remove finished items. Returns the ids that were still ours; the rest were lost to a peer."""
    if not leases:
        return set()
    ids, tokens = _pairs(leases)
    with connections[using].cursor() as cursor:
        cursor.execute(
            """
            DELETE FROM queue_state q USING unnest(%s::bigint[], %s::uuid[]) AS mine(item_id, lock_token)
            WHERE q.item_id = mine.item_id AND q.lock_token = mine.lock_token
            RETURNING q.item_id
            """,
            [ids, tokens],
        )
        return {row[0] for row in cursor.fetchall()}


def settle_ctes(source: str, *, returning: str = "q.item_id", reroute: bool = False) -> str:
    """`settle_found AS (…), acked AS (DELETE …), released AS (UPDATE …)`: a batch's leases settled
    inside a caller's single statement (the dispatcher's record, dispatch.delivery), as `claim_ctes`
    is a claim. `source` is a relation with columns item_id, lock_token, settle and delay: settle
    'ack' removes the item; 'release' puts it back after `delay` seconds (a retry: ready again once it
    is due); 'refund' puts it back and undoes the claim's attempt (given back untried). A released
    item's `rate_limited` is decided again from the limits as they are now. Fenced by lock_token: an
    item a peer re-claimed is not ours, and neither CTE returns it. `reroute`: `source` also has
    `provider_id`, the provider a released item's next try goes through (null: the same one); an
    item that changes provider changes lane too (a re-route stays within the item's tenant).

    Each item is found by its primary key, one probe per row of `source` (`settle_found`, a LATERAL
    kept apart by OFFSET 0, so the batch is always the outer side), and settled by the row address
    the probe found: the only other way into `queue_state` by address is a sequential scan, which
    the planner costs by the table's pages as they are now. Joined by item id alone, a generic plan
    made on the statistics of a nearly empty queue (one live row on many pages) reads the whole
    queue by primary key and rescans the batch for each row. A row keeps its address while its
    lease holds, because nothing but its holder updates a leased row (`sync_rate_limited` leaves
    them alone); any other update also changes lock_token, which the settle checks again on the
    row's newest version. `source` is read once: a CTE or table name, or a subquery."""
    lane = "coalesce(o.provider_id, q.provider_id)" if reroute else "q.provider_id"
    provider = (", provider_id = coalesce(o.provider_id, q.provider_id)" if reroute else "") + (
        f", rate_limited = {_lane_flag_now(lane, 'q.tenant_id', 'q.rate_limited')}"
    )
    return f"""settle_found AS (
        SELECT o.*, x.ctid AS found_at FROM {source} o
        CROSS JOIN LATERAL (
            SELECT q.ctid FROM queue_state q WHERE q.item_id = o.item_id AND q.lock_token = o.lock_token OFFSET 0
        ) x
    ), acked AS (
        DELETE FROM queue_state q USING settle_found o
        WHERE q.ctid = o.found_at AND q.lock_token = o.lock_token AND o.settle = 'ack'
        RETURNING {returning}
    ), released AS (
        UPDATE queue_state q
        SET lock_token = NULL, locked_until = NULL,
            -- back at once: the indexed columns as they were (a HOT update); after a delay: out of the
            -- ready set until then
            available_at = CASE WHEN o.delay > 0 THEN now() + o.delay * interval '1 second'
                                ELSE least(q.available_at, now()) END,
            ready = o.delay <= 0,
            enqueued_at = CASE WHEN o.delay > 0 THEN now() + o.delay * interval '1 second' ELSE q.enqueued_at END,
            attempts = greatest(q.attempts - CASE WHEN o.settle = 'refund' THEN 1 ELSE 0 END, 0){provider}
        FROM settle_found o
        WHERE q.ctid = o.found_at AND q.lock_token = o.lock_token AND o.settle IN ('release', 'refund')
        RETURNING {returning}
    )"""


def release(
    leases: Sequence[Lease],
    delays: Sequence[float] | float = 0.0,
    *,
    refund_attempt: bool = False,
    using: str = "default",
) -> set[int]:
    """Give items back, ready after `delays` seconds (one per lease, or one for all).

    A delayed item re-enters the queue at the end of its delay (its `enqueued_at` moves there), so
    waiting retries neither count as old for starvation nor sit in front of ready work.
    `refund_attempt` undoes the claim's attempt count (rate-limit deferrals are not attempts).
    """
    if not leases:
        return set()
    ids, tokens = _pairs(leases)
    per_item = [float(delays)] * len(ids) if isinstance(delays, int | float) else [float(d) for d in delays]
    refund = 1 if refund_attempt else 0
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE queue_state q
            SET lock_token = NULL, locked_until = NULL,
                available_at = CASE WHEN mine.delay > 0 THEN now() + mine.delay * interval '1 second'
                                    ELSE least(q.available_at, now()) END,
                ready = mine.delay <= 0,
                enqueued_at = CASE WHEN mine.delay > 0 THEN now() + mine.delay * interval '1 second'
                                   ELSE q.enqueued_at END,
                attempts = greatest(q.attempts - %s, 0),
                rate_limited = {_lane_flag_now("q.provider_id", "q.tenant_id", "q.rate_limited")}
            FROM unnest(%s::bigint[], %s::uuid[], %s::float8[]) AS mine(item_id, lock_token, delay)
            WHERE q.item_id = mine.item_id AND q.lock_token = mine.lock_token
            RETURNING q.item_id
            """,  # noqa: S608 - fixed fragments
            [refund, ids, tokens, per_item],
        )
        return {row[0] for row in cursor.fetchall()}


def extend(leases: Sequence[Lease], lease_seconds: float | None = None, *, using: str = "default") -> set[int]:
    """Push the lease of items still held further out; returns the ids still ours (an item whose lease
    ran out but that no one re-claimed yet is still ours). A HOT update: only locked_until changes."""
    if not leases:
        return set()
    lease = float(settings.OMNIPOST_LEASE_SECONDS if lease_seconds is None else lease_seconds)
    ids, tokens = _pairs(leases)
    with connections[using].cursor() as cursor:
        cursor.execute(
            """
            UPDATE queue_state q
            SET locked_until = now() + %s * interval '1 second'
            FROM unnest(%s::bigint[], %s::uuid[]) AS mine(item_id, lock_token)
            WHERE q.item_id = mine.item_id AND q.lock_token = mine.lock_token
            RETURNING q.item_id
            """,
            [lease, ids, tokens],
        )
        return {row[0] for row in cursor.fetchall()}


# --- stage: due items back into the ready set ----------------------------------------------------
STAGE_SECONDS = 0.25  # how often a dispatcher stages: a retry or a delayed enqueue is ready this much late
STAGE_LIMIT = 5000  # items per statement; a dispatcher stages again at once while it finds a full batch


@dataclass(frozen=True, slots=True)
class Staged:
    count: int = 0
    rate_limited: int = 0  # of which rate-limited: their lanes should be looked at again


def stage(limit: int = STAGE_LIMIT, *, using: str = "default") -> Staged:
    """Move up to `limit` waiting items whose `available_at` has passed (retries, delayed enqueues)
    into the ready set, oldest first: one statement, reading queue_state_delayed_idx (so only due
    rows), skipping rows a peer holds. Leases are not staged: a leased item never left the ready set,
    and an expired lease is claimable as it is (its holder may still record it until someone
    re-claims it)."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            """
            WITH due AS (
                SELECT ctid FROM queue_state WHERE NOT ready AND available_at <= now()
                ORDER BY available_at LIMIT %s FOR UPDATE SKIP LOCKED
            ), staged AS (
                UPDATE queue_state SET ready = true WHERE ctid = ANY(ARRAY(SELECT ctid FROM due))
                RETURNING rate_limited
            )
            SELECT count(*), count(*) FILTER (WHERE rate_limited) FROM staged
            """,
            [limit],
        )
        count, limited = cursor.fetchone()
    return Staged(int(count), int(limited))


# --- rate limits that changed under queued items -----------------------------------------------------
def _lane_flag_now(lane: str, tenant: str, current: str) -> str:
    """`rate_limited` for an item coming back from a lease (SQL): decided from its lane's and tenant's
    limits as they are now, as `sync_rate_limited` leaves leased items alone; `current` for an item
    without a lane, which no limit changes."""
    return f"CASE WHEN {lane} IS NULL THEN {current} ELSE {_limited_now(lane, tenant)} END"


def _limited_now(lane: str, tenant: str) -> str:
    """Whether an item of `lane` and `tenant` (SQL expressions) goes through its lane, from the
    limits as they are now: one probe of `lane_limits` and one of `tenants`."""
    return f"""coalesce((SELECT {ratelimit.limited_sql("lim_p", "lim_t")}
                         FROM tenants lim_t LEFT JOIN lane_limits lim_p ON lim_p.lane_id = {lane}
                         WHERE lim_t.id = {tenant}), false)"""


def set_lane_limit(
    lane_id: int, *, tenant_id: uuid.UUID, rate_per_second: float | None, burst: float | None = None,
    using: str = "default",
) -> int:
    """Record a lane's configured limit (None: it has none) and re-decide its queued items, in the
    caller's transaction: the app that owns the lane calls it whenever the limit is set, changed or
    removed. Two statements; returns how many items changed lanes."""
    with connections[using].cursor() as cursor:
        if rate_per_second is None:
            cursor.execute("DELETE FROM lane_limits WHERE lane_id = %s", [lane_id])
        else:
            cursor.execute(
                """INSERT INTO lane_limits (lane_id, tenant_id, rate_per_second, burst, updated_at)
                   VALUES (%s, %s, %s, %s, now())
                   ON CONFLICT (lane_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id,
                       rate_per_second = EXCLUDED.rate_per_second, burst = EXCLUDED.burst, updated_at = now()""",
                [lane_id, tenant_id, float(rate_per_second), None if burst is None else float(burst)],
            )
    return sync_rate_limited(provider_ids=[lane_id], using=using)


def sync_rate_limited(
    *, provider_ids: Sequence[int] = (), tenant_ids: Sequence[uuid.UUID] = (), using: str = "default"
) -> int:
    """Re-decide `rate_limited` of the queued items of these lanes and of every item of these
    tenants, from their limits as they are now (in the caller's transaction: whoever saves a limit
    calls it there). Returns how many items changed lanes. Finds the items by lane or tenant, with
    no index of their own: a limit changes rarely, and a scan of the live queue once per change
    costs less than an index written by every enqueue and claim.

    Items under a lease are left alone: the lane is a claim's concern, and an item in flight gets its
    flag when it comes back (`settle_ctes`' release, `release`, `release_claim`). Moving a leased
    row would also move it from under its holder's settle, which finds it by row address. An item
    whose holder died keeps its flag until it is settled: its first claim after the lease ran out
    goes by the limit as it was; so does an item released while the transaction saving a limit is
    still open (its release reads the limits committed before), until its next release."""
    if not provider_ids and not tenant_ids:
        return 0
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE queue_state q SET rate_limited = NOT q.rate_limited
            WHERE q.provider_id IS NOT NULL AND (q.provider_id = ANY(%s::bigint[]) OR q.tenant_id = ANY(%s::uuid[]))
              AND q.lock_token IS NULL AND q.rate_limited <> {_limited_now("q.provider_id", "q.tenant_id")}
            """,  # noqa: S608 - fixed fragments
            [list(provider_ids), list(tenant_ids)],
        )
        return cursor.rowcount


def rate_limited_providers(queues: Sequence[str] | None = None, *, using: str = "default") -> list[int]:
    """Providers with ready rate-limited items not in flight (in `queues`, if named), whatever their
    limits say now: lanes are offered to all of them, so items whose limit went away are never
    stranded. A loose index scan of queue_state_lane_idx: one descent per provider, stepping over its
    items in flight, not one row per waiting item."""
    in_queues = (
        """AND EXISTS (SELECT 1 FROM queue_state w WHERE w.ready AND w.rate_limited AND w.provider_id = p.id
                       AND (w.locked_until IS NULL OR w.locked_until <= now())
                       AND w.queue_name = ANY(%(queues)s::text[]))"""
        if queues
        else ""
    )
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE p(id) AS (
                (SELECT provider_id FROM queue_state WHERE ready AND rate_limited AND provider_id IS NOT NULL
                   AND {_FREE} ORDER BY provider_id LIMIT 1)
                UNION ALL
                SELECT (SELECT provider_id FROM queue_state WHERE ready AND rate_limited AND provider_id > p.id
                          AND {_FREE} ORDER BY provider_id LIMIT 1)
                FROM p WHERE p.id IS NOT NULL
            )
            SELECT id FROM p WHERE id IS NOT NULL {in_queues}
            """,
            {"queues": list(queues or [])},
        )
        return [row[0] for row in cursor.fetchall()]


def drop_tenant_items(tenant_id: uuid.UUID, *, using: str = "default") -> int:
    """Delete every item of one tenant, leased or not, in one plain DELETE (no ORM cascade that
    would load a million rows first). For wiping a tenant's work wholesale (the benchmarks')."""
    with connections[using].cursor() as cursor:
        cursor.execute("DELETE FROM queue_state WHERE tenant_id = %s", [tenant_id])
        return cursor.rowcount


def release_claim(tokens: Sequence[uuid.UUID], *, using: str = "default") -> int:
    """Give back, untried and ready at once, every item still leased with one of `tokens`: the
    claims of a caller whose session was lost during the claim statement, which may have committed
    with no one left to send what it leased. Refunds the claim's attempt. Returns how many came back.

    Rare (only after a lost session), so it may scan: lock_token has no index of its own."""
    if not tokens:
        return 0
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE queue_state q
            SET lock_token = NULL, locked_until = NULL, available_at = least(available_at, now()), ready = true,
                attempts = greatest(attempts - 1, 0),
                rate_limited = {_lane_flag_now("q.provider_id", "q.tenant_id", "q.rate_limited")}
            WHERE lock_token = ANY(%s::uuid[])
            """,  # noqa: S608 - fixed fragments
            [list(tokens)],
        )
        return cursor.rowcount


# --- lock and remove by notification (cancels) ------------------------------------------------------
def lock_for(notification_ids: Any, *, tenant_id: Any, using: str = "default") -> dict[str, bool]:  # noqa: ANN401
    """Lock the items of these notifications (ids, or a `values("id")` subquery) with FOR UPDATE in
    the caller's transaction, in item order (the order the dispatcher's record statement locks), and
    say for each whether a claimer holds a live lease on it (by the database's clock): one statement.
    A claim in flight is waited for and then seen as a lease; an idle item can no longer be claimed."""
    from django.db.models import BooleanField, ExpressionWrapper

    from queueing.models import LEASED, QueueItem

    rows = (
        QueueItem.objects.using(using)
        .for_tenant(tenant_id)
        .select_for_update()
        .filter(notification_id__in=notification_ids)
        .order_by("item_id")
        .annotate(leased=ExpressionWrapper(LEASED, output_field=BooleanField()))
        .values_list("notification_id", "leased")
    )
    return {str(nid): is_leased for nid, is_leased in rows}


def remove_for(notification_ids: Any, *, tenant_id: Any, using: str = "default") -> int:  # noqa: ANN401
    """Delete the items of these notifications (ids, or a `values("id")` subquery), whoever holds
    them, in the caller's transaction: one statement. For cancels, which `lock_for` the items first
    and leave the leased ones out."""
    from queueing.models import QueueItem

    return QueueItem.objects.using(using).for_tenant(tenant_id).filter(notification_id__in=notification_ids).delete()[0]


def rate_limited_sql(lane: str, tenant: str) -> str:
    """Whether an item goes through its rate-limited lane, in SQL over a row with the lane's
    `rate_per_second` (a `lane_limits` row, or the row the lane's owner keeps it in) and a `tenants`
    row (aliases): what enqueues and re-routes write into `rate_limited`, for a router to ask of the
    lanes it may move items to."""
    return ratelimit.limited_sql(lane, tenant)


def remove_idle_sql(source: str) -> str:
    """`DELETE … RETURNING q.notification_id` of the items of the notifications in
    `source` (a FROM item aliased `s`, with a notification_id column) that no claimer holds a live
    lease on, by the database's clock; a claim in flight is waited for and then seen as a lease.
    A fragment for a caller's statement (a receipt cancelling a promoted fallback)."""
    return f"""DELETE FROM queue_state q USING {source}
        WHERE q.notification_id = s.notification_id AND NOT (q.lock_token IS NOT NULL AND q.locked_until > now())
        RETURNING q.notification_id"""  # noqa: S608 - the caller's FROM item
