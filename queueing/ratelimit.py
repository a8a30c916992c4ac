"""Token buckets shared by every dispatcher process through the database.

`tokens = min(burst, tokens + elapsed * effective_rate)`, refilled on the database clock. A
dispatcher takes several tokens at once for a whole batch (one short transaction: lock the bucket
rows, compute, write back), then claims exactly that many of the provider's items, so nothing is
claimed that cannot be sent and N processes together never exceed the rate. Unused grants are
given back the same way.

A lane is one rate-limited provider. Its keys are `provider:<id>` (when the provider has a
limit) and `tenant:<id>` (when its tenant has one); a lane's grant is what all its keys allow,
and lanes of one tenant share the tenant's tokens.

Adaptive limits (AIMD): a 429 multiplies the provider's effective rate by 0.7 (at most once a
second, never below a floor); while it succeeds the rate climbs back additively, 2 % of the
configured rate per second, toward the configured rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from django.db import connections, transaction

from queueing.models import RateBucket

MIN_RATE_FRACTION = 0.05  # the adaptive rate never falls below 5 % of the configured rate …
MIN_RATE_FLOOR = 0.2  # … nor below one token every five seconds
DECREASE_FACTOR = 0.7  # multiplicative decrease on 429
DECREASE_INTERVAL = 1.0  # seconds between two decreases of one bucket (one burst of 429s counts once)
INCREASE_PER_SECOND = 0.02  # additive increase while succeeding: 2 % of the configured rate per second


# --- whether an item is rate-limited: the one rule ------------------------------------------------------
# An item goes through a lane when its lane (provider) or its tenant has a limit *now*: the enqueue
# decides from the current rows (`queue.insert_items_sql`: the lane's row of `lane_limits`, which the
# lane's owner keeps in sync with its configuration, and the tenant's), a saved limit re-decides that
# lane's or tenant's queued items (`queue.set_lane_limit`, `queue.sync_rate_limited`), and
# `queue.rate_limited_providers` lets lanes serve items whose limit went away before the flag caught up.
def is_limited(provider_rate: float | None, tenant_rate: float | None) -> bool:
    return provider_rate is not None or tenant_rate is not None


def limited_sql(lane: str, tenant: str) -> str:
    """`is_limited` in SQL over a row with the lane's `rate_per_second` (a `lane_limits` row, outer
    joined: none when the lane has no limit) and a `tenants` row (aliases)."""
    return f"({lane}.rate_per_second IS NOT NULL OR {tenant}.rate_per_second IS NOT NULL)"


def provider_key(provider_id: int) -> str:
    return f"provider:{provider_id}"


def tenant_key(tenant_id: object) -> str:
    return f"tenant:{tenant_id}"


@dataclass(frozen=True, slots=True)
class LaneSpec:
    """A rate-limited provider and the limits that apply to it."""

    provider_id: int
    tenant_id: object
    provider_rate: float | None
    provider_burst: float | None
    tenant_rate: float | None
    tenant_burst: float | None

    def keys(self) -> list[tuple[str, float, float]]:
        keys = []
        if self.provider_rate is not None:
            keys.append(
                (provider_key(self.provider_id), self.provider_rate, _burst(self.provider_rate, self.provider_burst))
            )
        if self.tenant_rate is not None:
            keys.append((tenant_key(self.tenant_id), self.tenant_rate, _burst(self.tenant_rate, self.tenant_burst)))
        return keys


def _burst(rate: float, burst: float | None) -> float:
    return float(burst) if burst else max(1.0, float(rate))


@dataclass(frozen=True, slots=True)
class Grant:
    granted: dict[int, int]  # provider id -> tokens taken
    next_token_in: float | None  # seconds until the starved lanes can expect a token, if any starved


def _db_now(using: str) -> datetime:
    with connections[using].cursor() as cursor:
        # clock_timestamp(), not now(): now() is the transaction's start, taken before the row lock
        # was granted, and a peer may have written a later time meanwhile.
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _locked_buckets(keys: dict[str, tuple[float, float]], using: str) -> dict[str, RateBucket]:
    """Create missing buckets (full), then lock and return all of them, in key order (no deadlocks)."""
    RateBucket.objects.using(using).bulk_create(
        [RateBucket(key=k, rate=r, effective_rate=r, burst=b, tokens=b) for k, (r, b) in keys.items()],
        ignore_conflicts=True,
    )
    qs = RateBucket.objects.using(using).filter(key__in=sorted(keys)).order_by("key").select_for_update()
    buckets = {b.key: b for b in qs}
    for key, (rate, burst) in keys.items():
        bucket = buckets[key]
        if bucket.rate != rate or bucket.burst != burst:  # configuration changed since the bucket was made
            bucket.effective_rate = min(bucket.effective_rate, rate) if bucket.rate >= rate else rate
            bucket.rate, bucket.burst = rate, burst
            bucket.tokens = min(bucket.tokens, burst)
    return buckets


def _refill(bucket: RateBucket, now: datetime) -> None:
    if now <= bucket.updated_at:  # never move the bucket's clock backwards (no double refill)
        return
    elapsed = (now - bucket.updated_at).total_seconds()
    bucket.tokens = min(bucket.burst, bucket.tokens + elapsed * bucket.effective_rate)
    bucket.updated_at = now


def _save(buckets: Iterable[RateBucket], using: str) -> None:
    RateBucket.objects.using(using).bulk_update(
        list(buckets), ["tokens", "updated_at", "rate", "burst", "effective_rate", "decreased_at", "increased_at"]
    )


def take(lanes: Mapping[int, LaneSpec], want: Mapping[int, int], *, using: str = "default") -> Grant:
    """Take up to `want[provider_id]` tokens for each lane, all-or-nothing per token across its keys."""
    keys: dict[str, tuple[float, float]] = {}
    for pid in want:
        for key, rate, burst in lanes[pid].keys():
            keys[key] = (rate, burst)
    if not keys:
        return Grant({pid: n for pid, n in want.items()}, None)
    with transaction.atomic(using=using):
        buckets = _locked_buckets(keys, using)
        now = _db_now(using)
        for bucket in buckets.values():
            _refill(bucket, now)
        granted: dict[int, int] = {}
        waits: list[float] = []
        for pid, n in want.items():
            lane_keys = [buckets[k] for k, _, _ in lanes[pid].keys()]
            allowed = min([n] + [math.floor(b.tokens + 1e-9) for b in lane_keys])
            allowed = max(0, allowed)
            for b in lane_keys:
                b.tokens -= allowed
            granted[pid] = allowed
            if allowed < n:
                waits.append(max((1.0 - b.tokens) / b.effective_rate for b in lane_keys if b.tokens < 1.0))
        _save(buckets.values(), using)
    return Grant(granted, min(waits) if waits else None)


# take_key: the lock, the refill from the database's clock, the grant and the write in ONE
# statement, so the bucket's row is locked for the statement only (the API's and the receipts'
# throttles call it from every web thread; a transaction of five round trips held it for milliseconds
# at a time). As _locked_buckets then _refill: a changed configuration caps the tokens and the
# effective rate first; the clock never moves backwards.
_TAKE_KEY = """
    WITH cur AS (
        SELECT key, %(rate)s::float8 AS rate, %(burst)s::float8 AS burst,
               CASE WHEN rate = %(rate)s AND burst = %(burst)s THEN effective_rate
                    WHEN rate >= %(rate)s THEN least(effective_rate, %(rate)s) ELSE %(rate)s END AS effective_rate,
               CASE WHEN rate = %(rate)s AND burst = %(burst)s THEN tokens ELSE least(tokens, %(burst)s) END AS tokens,
               updated_at, clock_timestamp() AS at
        FROM rate_limit_buckets WHERE key = %(key)s
        FOR UPDATE
    ), refilled AS (
        SELECT key, rate, burst, effective_rate,
               CASE WHEN at > updated_at
                    THEN least(burst, tokens + extract(epoch FROM at - updated_at)::float8 * effective_rate)
                    ELSE tokens END AS tokens,
               greatest(at, updated_at) AS at
        FROM cur
    ), granted AS (
        SELECT *, greatest(0, least(%(want)s, floor(tokens + 1e-9)::int)) AS n FROM refilled
    )
    UPDATE rate_limit_buckets b
    SET tokens = g.tokens - g.n, updated_at = g.at, rate = g.rate, burst = g.burst, effective_rate = g.effective_rate
    FROM granted g WHERE b.key = g.key
    RETURNING g.n, b.tokens, b.effective_rate
"""


def take_key(key: str, rate: float, burst: float, want: int, *, using: str = "default") -> tuple[int, float | None]:
    """Take up to `want` tokens from one bucket; returns (granted, seconds until the next token or None)."""
    params = {"key": key, "rate": float(rate), "burst": float(burst), "want": int(want)}
    with connections[using].cursor() as cursor:
        cursor.execute(_TAKE_KEY, params)
        row = cursor.fetchone()
        if row is None:  # the bucket's first use: make it (full), then take
            RateBucket.objects.using(using).bulk_create(
                [RateBucket(key=key, rate=rate, effective_rate=rate, burst=burst, tokens=burst)],
                ignore_conflicts=True,
            )
            cursor.execute(_TAKE_KEY, params)
            row = cursor.fetchone()
    granted, tokens, effective_rate = row
    wait = None if granted >= want else max(0.0, (1.0 - tokens) / effective_rate)
    return granted, wait


def give_back(lanes: Mapping[int, LaneSpec], unused: Mapping[int, int], *, using: str = "default") -> None:
    """Return tokens a lane was granted but could not use (fewer items were ready)."""
    unused = {pid: n for pid, n in unused.items() if n > 0}
    if not unused:
        return
    keys = {key: (rate, burst) for pid in unused for key, rate, burst in lanes[pid].keys()}
    if not keys:
        return
    with transaction.atomic(using=using):
        buckets = _locked_buckets(keys, using)
        now = _db_now(using)
        for bucket in buckets.values():
            _refill(bucket, now)
        for pid, n in unused.items():
            for key, _, _ in lanes[pid].keys():
                buckets[key].tokens = min(buckets[key].burst, buckets[key].tokens + n)
        _save(buckets.values(), using)


def adapt(throttled: Iterable[int], succeeded: Iterable[int], *, using: str = "default") -> None:
    """AIMD on provider buckets: halve on 429 (at most once a second), add a step on success."""
    throttled = set(throttled)
    succeeded = set(succeeded) - throttled
    if not throttled and not succeeded:
        return
    keys = [provider_key(p) for p in throttled | succeeded]
    with transaction.atomic(using=using):
        qs = RateBucket.objects.using(using).filter(key__in=sorted(keys)).order_by("key").select_for_update()
        locked = list(qs)
        now = _db_now(using)
        changed = []
        for bucket in locked:
            pid = int(bucket.key.split(":", 1)[1])
            floor = max(MIN_RATE_FLOOR, bucket.rate * MIN_RATE_FRACTION)
            if pid in throttled:
                last = bucket.decreased_at
                if last is None or (now - last).total_seconds() >= DECREASE_INTERVAL:
                    _refill(bucket, now)
                    bucket.effective_rate = max(floor, bucket.effective_rate * DECREASE_FACTOR)
                    bucket.tokens = min(bucket.tokens, 1.0)
                    bucket.decreased_at = bucket.increased_at = now
                    changed.append(bucket)
            elif bucket.effective_rate < bucket.rate:
                _refill(bucket, now)
                since = (now - (bucket.increased_at or now)).total_seconds()
                step = bucket.rate * INCREASE_PER_SECOND * min(since, 5.0)
                bucket.effective_rate = min(bucket.rate, bucket.effective_rate + step)
                bucket.increased_at = now
                changed.append(bucket)
            elif bucket.increased_at is not None:
                bucket.increased_at = None
                changed.append(bucket)
        _save(changed, using)


def effective_rates(provider_ids: Iterable[int], *, using: str = "default") -> dict[int, float]:
    """The adaptive rate of each provider that has a bucket (for the API and the admin)."""
    keys = [provider_key(p) for p in provider_ids]
    return {
        int(k.split(":", 1)[1]): r
        for k, r in RateBucket.objects.using(using).filter(key__in=keys).values_list("key", "effective_rate")
    }
