"""Circuit breakers per provider, shared by every dispatcher through PostgreSQL.

A provider's `circuit` settings say when its breaker opens: at least `min_requests` sends in the
rolling `window_seconds`, of which a `failure_threshold` fraction (0–1) ended in a transient failure
(permanent failures count as sends, not as failures). It stays open `open_seconds`, then reads
`half_open`: up to PROBES sends go through (reserved in the row, so across every dispatcher); one
success closes it and resets the window, one transient failure opens it again.

Nothing here is written per delivery. The window's counts are the `/metrics` counters the record
statement already keeps (notifications.counters, cumulative per provider and outcome): this row holds
their totals at the window's start (`base_*`) and the previous window's counts (`prev_*`, for the
sliding estimate `prev · (1 − elapsed / window) + current`). The record statement
(dispatch.delivery, the `circuit_*` CTEs from `record_ctes`) reads and writes the row only for a
provider whose batch had a transient failure or whose breaker is not closed, and decides every
transition in SQL on the database's clock. A missing row is a closed breaker.

`half_open` is not stored: it is an `open` row whose `opened_at + open_seconds` has passed
(`STATE_SQL`), so a breaker half-opens on time alone, with no one to write it.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection, models
from django.db.models.expressions import RawSQL

from providers.circuit import CLOSED, setting_sql

PROBES = 3


def state_sql(provider: str = "p", row: str = "c") -> str:
    """The state of breaker row `row` of provider `provider` (closed without a row), by the database's clock."""
    return f"""CASE WHEN {row}.state IS DISTINCT FROM 'open' THEN 'closed'
    WHEN now() >= {row}.opened_at + {setting_sql(provider, "open_seconds")} * interval '1 second' THEN 'half_open'
    ELSE 'open' END"""


STATE_SQL = state_sql()


def state_annotation() -> RawSQL:
    """`circuit_state` of each provider of a queryset (closed without a row): one subquery, which
    `Provider.objects.as_shown()` adds (handed to providers by notifications.apps)."""
    state = f"""coalesce((SELECT {state_sql('providers', 'c')} FROM provider_circuits c
                          WHERE c.provider_id = providers.id), 'closed')"""  # noqa: S608 - fixed fragments
    return RawSQL(state, [], output_field=models.CharField())  # noqa: S611


class ProviderCircuit(models.Model):
    """A provider's breaker (see the module's docstring); written only by the record statement and by
    `reserve_probes`."""

    provider = models.OneToOneField("providers.Provider", on_delete=models.CASCADE, primary_key=True,
                                    related_name="circuit_row")  # fmt: skip
    state = models.CharField(max_length=8, default=CLOSED)  # closed | open (half_open is derived)
    opened_at = models.DateTimeField(null=True, blank=True)
    probes = models.PositiveSmallIntegerField(default=0)  # sends let through since it half-opened
    window_started_at = models.DateTimeField()
    base_requests = models.BigIntegerField(default=0)  # the provider's counters at the window's start
    base_failures = models.BigIntegerField(default=0)
    prev_requests = models.BigIntegerField(default=0)  # the previous window's counts
    prev_failures = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "provider_circuits"

    def __str__(self) -> str:
        return f"breaker of provider {self.provider_id}: {self.state}"


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


def routing_snapshot() -> tuple[list[tuple[int, str, str, bool]], dict[int, str]]:
    """What a dispatcher routes by, in one query: every provider in a failover order as (id, tenant
    id, channel, rate-limited: its or its tenant's `rate_per_second` is set), ordered by tenant,
    channel, `failover_order` and name; and every breaker that is open or half-open (as `not_closed`)."""
    from queueing.queue import rate_limited_sql

    lane = rate_limited_sql("p", "t")
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT p.id, p.tenant_id::text, p.channel, {lane}, p.failover_order IS NOT NULL,
                       CASE WHEN c.provider_id IS NULL THEN 'closed' ELSE {STATE_SQL} END
                FROM providers p JOIN tenants t ON t.id = p.tenant_id
                LEFT JOIN provider_circuits c ON c.provider_id = p.id AND c.state = 'open'
                WHERE p.failover_order IS NOT NULL OR c.provider_id IS NOT NULL
                ORDER BY p.tenant_id, p.channel, p.failover_order, p.name"""  # noqa: S608 - fixed fragments
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


def record_ctes(attempts: str, counters_table: str = "delivery_counters") -> str:
    """CTEs for the record statement (after its `attempts` CTE, whose RETURNING has provider_id,
    outcome and http_status): the breakers this batch changes, decided from the counters as they were before this
    statement plus the batch's own attempts. Ends in `circuit AS (INSERT … ON CONFLICT …)`."""
    from notifications.counters import ATTEMPTS, THROTTLED

    thr, minr = setting_sql("p", "failure_threshold"), setting_sql("p", "min_requests")
    win = setting_sql("p", "window_seconds")
    opn = setting_sql("p", "open_seconds")
    return f"""circuit_batch AS (
        -- a 429 is the provider asking to slow down, which the adaptive rate does (queueing.ratelimit):
        -- it is neither a failure nor a success of the breaker's
        SELECT a.provider_id, count(*) AS sends, count(*) FILTER (WHERE a.outcome = 'transient_error') AS failures,
               count(*) FILTER (WHERE a.outcome = 'delivered') AS successes
        FROM {attempts} a WHERE a.provider_id IS NOT NULL AND a.http_status IS DISTINCT FROM 429
        GROUP BY a.provider_id
    ), circuit_seen AS (
        -- only providers whose breaker this batch may change: a transient failure, or not closed
        SELECT b.provider_id, b.sends, b.failures, b.successes, c.provider_id IS NOT NULL AS has_row,
               coalesce(c.state, 'closed') AS state, c.opened_at, c.window_started_at,
               coalesce(c.base_requests, 0) AS base_requests, coalesce(c.base_failures, 0) AS base_failures,
               coalesce(c.prev_requests, 0) AS prev_requests, coalesce(c.prev_failures, 0) AS prev_failures,
               c.state = 'open' AND now() >= c.opened_at + {opn} * interval '1 second' AS half_open,
               {thr} AS threshold, {minr} AS min_requests, {win} AS window_seconds,
               tot.requests + b.sends AS total_requests, tot.failures + b.failures AS total_failures
        FROM circuit_batch b
        JOIN providers p ON p.id = b.provider_id
        LEFT JOIN provider_circuits c ON c.provider_id = b.provider_id
        CROSS JOIN LATERAL (
            -- the attempts less those answered 429 (counted again under THROTTLED, as the batch above
            -- leaves them out)
            SELECT coalesce(sum(CASE WHEN dc.le = {THROTTLED} THEN -dc.count ELSE dc.count END), 0) AS requests,
                   coalesce(sum(CASE WHEN dc.le = {THROTTLED} THEN -dc.count ELSE dc.count END)
                            FILTER (WHERE dc.outcome = 'transient_error'), 0) AS failures
            FROM {counters_table} dc
            WHERE dc.shard = ANY(ARRAY(SELECT generate_series(0, {_shards() - 1}))) AND dc.provider_id = b.provider_id
              AND dc.outcome IN ('delivered', 'transient_error', 'permanent_error')
              AND dc.le IN ({ATTEMPTS}, {THROTTLED})
        ) tot
        WHERE b.failures > 0 OR c.state = 'open'
    ), circuit_window AS (
        SELECT s.*,
               NOT s.has_row OR s.window_started_at IS NULL
                   OR now() >= s.window_started_at + s.window_seconds * interval '1 second' AS rolled
        FROM circuit_seen s
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
    ), circuit AS (
        INSERT INTO provider_circuits AS pc (provider_id, state, opened_at, probes, window_started_at, base_requests,
                                             base_failures, prev_requests, prev_failures, updated_at)
        SELECT n.provider_id,
               CASE WHEN n.step IN ('open', 'reopen') THEN 'open' WHEN n.step = 'close' THEN 'closed' ELSE n.state END,
               CASE WHEN n.step IN ('open', 'reopen') THEN now() WHEN n.step = 'close' THEN NULL ELSE n.opened_at END,
               0,
               CASE WHEN n.step = 'close' THEN now() ELSE n.new_started_at END,
               CASE WHEN n.step = 'close' THEN n.total_requests ELSE n.new_base_requests END,
               CASE WHEN n.step = 'close' THEN n.total_failures ELSE n.new_base_failures END,
               CASE WHEN n.step = 'close' THEN 0 ELSE n.new_prev_requests END,
               CASE WHEN n.step = 'close' THEN 0 ELSE n.new_prev_failures END,
               now()
        FROM circuit_next n WHERE n.step <> 'keep'
        ORDER BY n.provider_id
        ON CONFLICT (provider_id) DO UPDATE SET
            state = excluded.state, opened_at = excluded.opened_at, probes = excluded.probes,
            window_started_at = excluded.window_started_at, base_requests = excluded.base_requests,
            base_failures = excluded.base_failures, prev_requests = excluded.prev_requests,
            prev_failures = excluded.prev_failures, updated_at = excluded.updated_at
        RETURNING pc.provider_id, pc.state
    )"""  # noqa: S608 - fixed fragments


def _shards() -> int:
    from notifications.counters import SHARDS

    return SHARDS
