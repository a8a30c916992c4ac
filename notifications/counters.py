"""Delivery counters for `/metrics`, kept up to date by the record statement, batch by batch.

A scrape must not cost more as history grows, so it never reads `delivery_attempts`:
the dispatcher's one record statement per batch (`dispatch.delivery._RECORD_SQL`) adds what
the batch did to this small table, and a scrape sums it (`totals()`).

Rows are keyed by (shard, provider_id, outcome, le):
- attempts: `outcome` is the attempt's outcome, `le` is ATTEMPTS (-1), `count` the attempts;
- throttled: of those, the attempts the provider answered 429 (its "slow down", which the adaptive
  rate heeds): `le` is THROTTLED (-2). The breakers (routing.circuits) leave them out of
  their totals; `/metrics` reads only ATTEMPTS rows, so they are counted there once, as attempts;
- latency (due → delivered, seconds): `outcome` is LATENCY, `provider_id` NO_PROVIDER, `le` the
  index of the first bound in LATENCY_BUCKETS the latency does not exceed (len(LATENCY_BUCKETS):
  beyond the last), `count` the deliveries and `total` their seconds: a cumulative histogram.

`shard` is the writing session's `pg_backend_pid() % SHARDS`: dispatchers each add to rows of
their own, so no row is one every batch of every dispatcher waits for; a scrape adds the shards up.

Nothing ever subtracts: `prune` deletes attempts, never counters, so the counters never go down.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable

from django.db import models, transaction
from django.db.models import F, Sum

from providers.simulator import ERROR_CLASS as SIMULATED

SHARDS = 16
NO_PROVIDER = 0  # an attempt without a provider (a provider deleted before it was recorded)
ATTEMPTS = -1
THROTTLED = -2
THROTTLED_STATUS = 429
LATENCY = "latency"
# Due → delivered, seconds. Console and loopback deliveries land in the first buckets; a provider that
# is down or rate-limited shows up in the last ones.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


def latency_bucket(seconds: float) -> int:
    """The `le` index of a latency: the first bound it does not exceed (Prometheus buckets are ≤)."""
    return bisect.bisect_left(LATENCY_BUCKETS, seconds)


class DeliveryCounter(models.Model):
    pk = models.CompositePrimaryKey("shard", "provider_id", "outcome", "le")
    shard = models.SmallIntegerField()
    # Not a foreign key: counters outlive the providers they count (and must not slow their deletion).
    provider_id = models.BigIntegerField()
    outcome = models.CharField(max_length=16)
    le = models.SmallIntegerField()
    count = models.BigIntegerField(default=0)
    total = models.FloatField(default=0.0)

    class Meta:
        db_table = "delivery_counters"

    def __str__(self) -> str:
        return f"{self.outcome}/{self.provider_id}/{self.le}: {self.count}"


Key = tuple[int, str, int]  # (provider_id, outcome, le)


def breaker_totals_sql(provider: str) -> str:
    """A subquery (for a LATERAL join) of one provider's `requests` and `failures` as its breaker counts
    them (routing.circuits): its attempts less those answered 429 (counted again under THROTTLED),
    and of those the transient failures, all shards added up. `provider` is the id's SQL expression."""
    return f"""(
            SELECT coalesce(sum(CASE WHEN dc.le = {THROTTLED} THEN -dc.count ELSE dc.count END), 0) AS requests,
                   coalesce(sum(CASE WHEN dc.le = {THROTTLED} THEN -dc.count ELSE dc.count END)
                            FILTER (WHERE dc.outcome = 'transient_error'), 0) AS failures
            FROM delivery_counters dc
            WHERE dc.shard = ANY(ARRAY(SELECT generate_series(0, {SHARDS - 1}))) AND dc.provider_id = {provider}
              AND dc.outcome IN ('delivered', 'transient_error', 'permanent_error')
              AND dc.le IN ({ATTEMPTS}, {THROTTLED})
        )"""  # noqa: S608 - fixed fragments


# The `le` of a delivery's latency `l.seconds`, in SQL (latency_bucket's rule).
_LATENCY_BUCKET = (
    "CASE "
    + " ".join(f"WHEN l.seconds <= {bound!r} THEN {i}" for i, bound in enumerate(LATENCY_BUCKETS))
    + f" ELSE {len(LATENCY_BUCKETS)} END"
)


def add_sql(attempts: str, changed: str) -> str:
    """The body of the record statement's `counted` CTE (dispatch.delivery): adds the batch's
    attempts (`attempts`: provider_id, outcome, http_status) and its deliveries' latencies
    (`changed`: status, seconds) to the session's shard, INSERT … ON CONFLICT, as `add` does."""
    return f"""
        -- /metrics' counters (notifications.counters), added to per batch: the session's own shard,
        -- rows in key order (peers that share a shard lock them in the same order)
        INSERT INTO delivery_counters AS dc (shard, provider_id, outcome, le, count, total)
        SELECT pg_backend_pid() %% {SHARDS}, x.provider_id, x.outcome, x.le, count(*), sum(x.seconds)
        FROM (
            -- a test notification's try was the simulator's (providers.simulator), not the provider's
            SELECT coalesce(a.provider_id, 0) AS provider_id, a.outcome, -1 AS le, 0::float8 AS seconds
            FROM {attempts} a WHERE a.error_class IS DISTINCT FROM '{SIMULATED}'
            UNION ALL
            SELECT coalesce(a.provider_id, 0), a.outcome, {THROTTLED}, 0 FROM {attempts} a WHERE a.http_status = 429
            UNION ALL
            SELECT 0, 'latency', {_LATENCY_BUCKET}, greatest(l.seconds, 0)
            FROM {changed} l WHERE l.status = 'delivered'
        ) x
        GROUP BY x.provider_id, x.outcome, x.le
        ORDER BY x.provider_id, x.outcome, x.le
        ON CONFLICT (shard, provider_id, outcome, le)
        DO UPDATE SET count = dc.count + excluded.count, total = dc.total + excluded.total"""  # noqa: S608 - the caller's CTE names and this module's constants


def add(increments: dict[Key, tuple[int, float]], *, shard: int = 0, using: str = "default") -> None:
    """Add counts (and seconds) to their rows, creating the rows that do not exist yet, through the
    ORM (the dispatcher's record statement does the same in its own SQL, INSERT … ON CONFLICT)."""
    with transaction.atomic(using=using):
        rows = DeliveryCounter.objects.using(using)
        for (provider_id, outcome, le), (n, seconds) in sorted(increments.items()):
            key = {"shard": shard, "provider_id": provider_id, "outcome": outcome, "le": le}
            if not rows.filter(**key).update(count=F("count") + n, total=F("total") + seconds):
                rows.create(**key, count=n, total=seconds)


def increments(
    attempts: Iterable[tuple[int | None, str] | tuple[int | None, str, int | None]], latencies: Iterable[float]
) -> dict[Key, tuple[int, float]]:
    """What a batch adds: its attempts as (provider_id, outcome[, http_status]) and its deliveries'
    latencies."""
    out: dict[Key, list] = defaultdict(lambda: [0, 0.0])
    for provider_id, outcome, *status in attempts:
        out[(provider_id or NO_PROVIDER, outcome, ATTEMPTS)][0] += 1
        if status and status[0] == THROTTLED_STATUS:
            out[(provider_id or NO_PROVIDER, outcome, THROTTLED)][0] += 1
    for seconds in latencies:
        seconds = max(0.0, seconds)
        cell = out[(NO_PROVIDER, LATENCY, latency_bucket(seconds))]
        cell[0] += 1
        cell[1] += seconds
    return {k: (n, s) for k, (n, s) in out.items()}


def totals(using: str = "default") -> dict[Key, tuple[int, float]]:
    """Every counter, its shards added up: one grouped scan of a table whose size is bounded by
    SHARDS × (providers × outcomes + buckets), whatever the number of attempts."""
    rows = (
        DeliveryCounter.objects.using(using)
        .values_list("provider_id", "outcome", "le")
        .annotate(n=Sum("count"), seconds=Sum("total"))
        .order_by()
    )
    return {(pid, outcome, le): (int(n), float(seconds)) for pid, outcome, le, n, seconds in rows}
