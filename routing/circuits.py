"""Circuit breakers per provider, shared by every dispatcher through PostgreSQL: their rows
(`provider_circuits`, routing.models.ProviderCircuit) and every statement that reads or writes them.

A provider's `circuit` settings say when its breaker opens: at least `min_requests` sends in the
rolling `window_seconds`, of which a `failure_threshold` fraction (0–1) ended in a transient failure
(permanent failures count as sends, not as failures). It stays open `open_seconds`, then reads
`half_open`: up to PROBES sends go through (reserved in the row, so across every dispatcher); one
success closes it and resets the window, one transient failure opens it again.

Nothing here is written per delivery. The window's counts are the `/metrics` counters the record
statement already keeps (notifications.counters, cumulative per provider and outcome, handed in as
`totals`): this row holds their totals at the window's start (`base_*`) and the previous window's
counts (`prev_*`, for the sliding estimate `prev · (1 − elapsed / window) + current`). The record
statement (dispatch.delivery, the `circuit_*` CTEs from `record_ctes`) reads and writes the row only
for a provider whose batch had a transient failure or whose breaker is not closed, and decides every
transition in SQL on the database's clock, as the pure function routing.breaker.transition does
(`transition_ctes`, `NEXT_ROW`; tests/routing/test_breaker_table.py holds the two to one table of
cases). A missing row is a closed breaker.

`half_open` is not stored: it is an `open` row whose `opened_at + open_seconds` has passed
(`STATE_SQL`), so a breaker half-opens on time alone, with no one to write it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.db import connection, models
from django.db.models.expressions import RawSQL

from providers.circuit import CLOSED, setting_sql
from providers.simulator import ERROR_CLASS as SIMULATED

PROBES = 3


def state_sql(provider: str = "p", row: str = "c") -> str:
    """The state of breaker row `row` of provider `provider` (closed without a row), by the database's clock."""
    return f"""CASE WHEN {row}.state IS DISTINCT FROM 'open' THEN 'closed'
    WHEN now() >= {row}.opened_at + {setting_sql(provider, "open_seconds")} * interval '1 second' THEN 'half_open'
    ELSE 'open' END"""


STATE_SQL = state_sql()


def state_annotation() -> RawSQL:
    """`circuit_state` of each provider of a queryset (closed without a row): one subquery, which
    `Provider.objects.as_shown()` adds (handed to providers by routing.apps)."""
    state = f"""coalesce((SELECT {state_sql('providers', 'c')} FROM provider_circuits c
                          WHERE c.provider_id = providers.id), 'closed')"""  # noqa: S608 - fixed fragments
    return RawSQL(state, [], output_field=models.CharField())  # noqa: S611


def states(provider_ids: Iterable[int]) -> dict[int, str]:
    """closed | open | half_open of each provider (closed when it has no row): one query."""
    ids = list(provider_ids)
    if not ids:
        return {}
    found: dict[int, str] = dict.fromkeys(ids, CLOSED)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT p.id, {STATE_SQL} FROM providers p JOIN provider_circuits c ON c.provider_id = p.id
                WHERE p.id = ANY(%s)""",  # noqa: S608 - fixed fragments
            [ids],
        )
        found.update(dict(cursor.fetchall()))
    return found


def not_closed() -> dict[int, str]:
    """Every breaker that is open or half-open (one query; few rows): what dispatchers route around."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT p.id, {STATE_SQL} FROM provider_circuits c JOIN providers p ON p.id = c.provider_id
                WHERE c.state = 'open'"""  # noqa: S608 - fixed fragments
        )
        return dict(cursor.fetchall())


# Provider kinds that take only recipients of their own kind (a device token of one vendor): they fail
# over to providers of the same kind only, in an order of their own within their channel's.
OWN_ORDER_KINDS = ("apns", "fcm", "webpush")


def routing_snapshot() -> tuple[list[tuple[int, str, str, bool]], dict[int, str]]:
    """What a dispatcher routes by, in one query: every provider in a failover order as (id, tenant
    id, order, rate-limited: its or its tenant's `rate_per_second` is set), ordered by tenant, order,
    `failover_order` and name, where `order` is the provider's channel, or `channel:kind` for the
    kinds of OWN_ORDER_KINDS (an APNs provider fails over to APNs providers only); and every breaker
    that is open or half-open (as `not_closed`)."""
    from queueing.queue import rate_limited_sql

    lane = rate_limited_sql("p", "t")
    kinds = ", ".join(f"'{kind}'" for kind in OWN_ORDER_KINDS)
    order = f"CASE WHEN p.kind IN ({kinds}) THEN p.channel || ':' || p.kind ELSE p.channel END"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT p.id, p.tenant_id::text, {order}, {lane}, p.failover_order IS NOT NULL,
                       CASE WHEN c.provider_id IS NULL THEN 'closed' ELSE {STATE_SQL} END
                FROM providers p JOIN tenants t ON t.id = p.tenant_id
                LEFT JOIN provider_circuits c ON c.provider_id = p.id AND c.state = 'open'
                WHERE p.failover_order IS NOT NULL OR c.provider_id IS NOT NULL
                ORDER BY p.tenant_id, 3, p.failover_order, p.name"""  # noqa: S608 - fixed fragments
        )
        rows = cursor.fetchall()
    ordered = [(pk, tenant_id, channel, limited) for pk, tenant_id, channel, limited, in_order, _ in rows if in_order]
    return ordered, {row[0]: row[-1] for row in rows if row[-1] != CLOSED}


def reserve_probes(wanted: dict[int, int]) -> dict[int, int]:
    """Take up to `wanted[provider]` of the PROBES sends a half-open breaker lets through, across
    every dispatcher (one statement, only while some breaker is half-open). Returns what was granted."""
    if not wanted:
        return {}
    ids, counts = list(wanted), [wanted[i] for i in wanted]
    with connection.cursor() as cursor:
        # The row lock (FOR UPDATE) makes a peer reserving at the same time wait and read our count.
        cursor.execute(
            f"""
            UPDATE provider_circuits c SET probes = c.probes + g.granted
            FROM (
                SELECT o.provider_id, least(w.n, %s - o.probes) AS granted
                FROM unnest(%s::bigint[], %s::int[]) AS w(provider_id, n)
                JOIN provider_circuits o ON o.provider_id = w.provider_id
                JOIN providers p ON p.id = o.provider_id
                WHERE o.state = 'open' AND o.probes < %s
                  AND now() >= o.opened_at + {setting_sql("p", "open_seconds")} * interval '1 second'
                ORDER BY o.provider_id
                FOR UPDATE OF o
            ) g
            WHERE c.provider_id = g.provider_id
            RETURNING c.provider_id, g.granted
            """,  # noqa: S608 - fixed fragments
            [PROBES, ids, counts, PROBES],
        )
        return {provider_id: int(n) for provider_id, n in cursor.fetchall() if n > 0}


def considered_sql(failures: str, state: str) -> str:
    """SQL of breaker.considered: the batch's transient failures and the row's stored state (or null)."""
    return f"{failures} > 0 OR {state} = 'open'"


def transition_ctes(seen: str) -> str:
    """CTEs that carry out breaker.transition for each row of `seen` (provider_id; the batch's sends,
    failures, successes; has_row and the row's state (closed without one), opened_at,
    window_started_at, base_* and prev_* (0 without a row); the settings threshold, min_requests,
    window_seconds, open_seconds; total_requests and total_failures, the counters with the batch).
    Ends in `circuit_next`: the step of each, and `NEXT_ROW`'s columns read from it."""
    return f"""circuit_window AS (
        SELECT s.*,
               s.state = 'open' AND now() >= s.opened_at + s.open_seconds * interval '1 second' AS half_open,
               NOT s.has_row OR s.window_started_at IS NULL
                   OR now() >= s.window_started_at + s.window_seconds * interval '1 second' AS rolled
        FROM {seen} s
    ), circuit_counts AS (
        SELECT w.*,
               CASE WHEN w.rolled THEN w.total_requests - w.sends ELSE w.base_requests END AS new_base_requests,
               CASE WHEN w.rolled THEN w.total_failures - w.failures ELSE w.base_failures END AS new_base_failures,
               CASE WHEN NOT w.rolled THEN w.prev_requests
                    WHEN w.has_row AND now() < w.window_started_at + 2 * w.window_seconds * interval '1 second'
                    THEN w.total_requests - w.sends - w.base_requests ELSE 0 END AS new_prev_requests,
               CASE WHEN NOT w.rolled THEN w.prev_failures
                    WHEN w.has_row AND now() < w.window_started_at + 2 * w.window_seconds * interval '1 second'
                    THEN w.total_failures - w.failures - w.base_failures ELSE 0 END AS new_prev_failures,
               CASE WHEN w.rolled THEN now() ELSE w.window_started_at END AS new_started_at
        FROM circuit_window w
    ), circuit_estimate AS (
        SELECT k.*, k.prev_share * k.new_prev_requests + (k.total_requests - k.new_base_requests) AS est_requests,
               k.prev_share * k.new_prev_failures + (k.total_failures - k.new_base_failures) AS est_failures
        FROM (
            SELECT x.*, greatest(0.0, 1.0 - extract(epoch FROM now() - x.new_started_at) / x.window_seconds)
                        AS prev_share
            FROM circuit_counts x
        ) k
    ), circuit_next AS (
        SELECT CASE WHEN e.half_open AND e.failures > 0 THEN 'reopen'
                    WHEN e.half_open AND e.successes > 0 THEN 'close'
                    WHEN e.state = 'open' THEN 'keep'
                    WHEN e.est_requests >= e.min_requests AND e.est_failures > 0
                         AND e.est_failures >= e.threshold * e.est_requests THEN 'open'
                    WHEN e.rolled THEN 'roll'
                    ELSE 'keep' END AS step,
               e.*
        FROM circuit_estimate e
    )"""  # noqa: S608 - fixed fragments


# The row a step writes, from `circuit_next n`: the columns of provider_circuits after provider_id,
# in order (probes: none taken yet, whatever the step).
NEXT_ROW = (
    ("state", "CASE WHEN n.step IN ('open', 'reopen') THEN 'open' WHEN n.step = 'close' THEN 'closed' "
              "ELSE n.state END"),
    ("opened_at", "CASE WHEN n.step IN ('open', 'reopen') THEN now() WHEN n.step = 'close' THEN NULL "
                  "ELSE n.opened_at END"),
    ("probes", "0"),
    ("window_started_at", "CASE WHEN n.step = 'close' THEN now() ELSE n.new_started_at END"),
    ("base_requests", "CASE WHEN n.step = 'close' THEN n.total_requests ELSE n.new_base_requests END"),
    ("base_failures", "CASE WHEN n.step = 'close' THEN n.total_failures ELSE n.new_base_failures END"),
    ("prev_requests", "CASE WHEN n.step = 'close' THEN 0 ELSE n.new_prev_requests END"),
    ("prev_failures", "CASE WHEN n.step = 'close' THEN 0 ELSE n.new_prev_failures END"),
    ("updated_at", "now()"),
)


# The breakers the record statement looked at (every provider of its batch with a transient failure
# or a breaker not closed, whoever opened it) and their state after it: two arrays in the statement's
# result, so that the dispatcher routes by them from its next claim on instead of at its next
# refresh (an open breaker gets at most the batches already claimed, not half a second of traffic).
RECORDED_STATES = """(SELECT array_agg(n.provider_id ORDER BY n.provider_id) FROM circuit_next n),
    (SELECT array_agg(CASE WHEN n.step IN ('open', 'reopen') THEN 'open' WHEN n.step = 'close' THEN 'closed'
                           WHEN n.state = 'open' AND n.half_open THEN 'half_open' ELSE n.state END
                      ORDER BY n.provider_id) FROM circuit_next n)"""


def recorded_states(ids: list[int] | None, states: list[str] | None) -> dict[int, str]:
    """RECORDED_STATES' two arrays as {provider id: closed | open | half_open}."""
    return dict(zip(ids or (), states or (), strict=True))


def record_ctes(attempts: str, totals: Callable[[str], str]) -> str:
    """CTEs for the record statement (after its `attempts` CTE, whose RETURNING has provider_id,
    outcome, http_status and error_class): the breakers this batch changes (breaker.transition), decided from the
    counters as they were before this statement plus the batch's own attempts. `totals(provider)` is
    the counters' subquery of (requests, failures) for a provider id expression, which the room that
    keeps the counters gives (notifications.counters.breaker_totals_sql). Ends in
    `circuit AS (INSERT … ON CONFLICT …)`."""
    settings = ", ".join(
        f"{setting_sql('p', key)} AS {name}"
        for key, name in (("failure_threshold", "threshold"), ("min_requests", "min_requests"),
                          ("window_seconds", "window_seconds"), ("open_seconds", "open_seconds"))
    )  # fmt: skip
    columns = ", ".join(name for name, _ in NEXT_ROW)
    values = ",\n               ".join(sql for _, sql in NEXT_ROW)
    updates = ", ".join(f"{name} = excluded.{name}" for name, _ in NEXT_ROW)
    return f"""circuit_batch AS (
        -- a 429 is the provider asking to slow down, which the adaptive rate does (queueing.ratelimit):
        -- it is neither a failure nor a success of the breaker's; nor is a test notification's try, which
        -- the simulator answered (providers.simulator), not the provider
        SELECT a.provider_id, count(*) AS sends, count(*) FILTER (WHERE a.outcome = 'transient_error') AS failures,
               count(*) FILTER (WHERE a.outcome = 'delivered') AS successes
        FROM {attempts} a WHERE a.provider_id IS NOT NULL AND a.http_status IS DISTINCT FROM 429
          AND a.error_class IS DISTINCT FROM '{SIMULATED}'
        GROUP BY a.provider_id
    ), circuit_seen AS (
        -- only providers whose breaker this batch may change: a transient failure, or not closed
        SELECT b.provider_id, b.sends, b.failures, b.successes, c.provider_id IS NOT NULL AS has_row,
               coalesce(c.state, 'closed') AS state, c.opened_at, c.window_started_at,
               coalesce(c.base_requests, 0) AS base_requests, coalesce(c.base_failures, 0) AS base_failures,
               coalesce(c.prev_requests, 0) AS prev_requests, coalesce(c.prev_failures, 0) AS prev_failures,
               {settings},
               tot.requests + b.sends AS total_requests, tot.failures + b.failures AS total_failures
        FROM circuit_batch b
        JOIN providers p ON p.id = b.provider_id
        LEFT JOIN provider_circuits c ON c.provider_id = b.provider_id
        CROSS JOIN LATERAL {totals("b.provider_id")} tot
        WHERE {considered_sql("b.failures", "c.state")}
    ), {transition_ctes("circuit_seen")}, circuit AS (
        INSERT INTO provider_circuits AS pc (provider_id, {columns})
        SELECT n.provider_id,
               {values}
        FROM circuit_next n WHERE n.step <> 'keep'
        ORDER BY n.provider_id
        ON CONFLICT (provider_id) DO UPDATE SET {updates}
        RETURNING pc.provider_id, pc.state
    )"""  # noqa: S608 - fixed fragments
