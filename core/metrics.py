"""`/metrics`: Prometheus text read from the database at scrape time.

Every figure lives in the database, so one scrape of any web process describes the whole system
(every dispatcher and scheduler, on any machine) and nothing is lost when a process restarts. A
scrape is a fixed number of queries (about ten), each served by an index:

- queue depth by queue/priority, ready/leased/delayed, oldest ready age: `queueing.stats.queue_figures()`,
  one grouped scan of `queue_state` (live items only, so it stays small);
- rate-limited items waiting for tokens: `queue_state_lane_idx`; token buckets: `rate_limit_buckets`
  (one row per limited provider or tenant);
- delivery attempts by outcome and provider (counters): `count(*)` over the whole of
  `delivery_attempts` grouped by (outcome, provider), plus what `prune` removed. The one costly
  query: a sequential scan, about 0.1-0.3 s per million attempts on PostgreSQL, bounded by
  retention (`prune --older-than`);
- delivery latency (a gauge histogram over the last OMNIPOST_METRICS_LATENCY_WINDOW_SECONDS,
  default 300): delivered attempts finished in that window (`attempt_finished_idx`), each joined
  to its notification for the time it became due;
- open dead letters: `queueing.stats.dlq_open()`, exact up to 100,000, then the planner's estimate;
- scheduler lag: min(run_at) of due pending jobs, `scheduled_jobs_due_idx`;
- workers live/stale: `queueing.stats.workers()`.

Counters stay monotonic across retention: `prune` writes, in the same transaction as each batch,
a `retention.prune` audit event (the audit log is append-only and never pruned) with the attempts
it removed per (outcome, provider); the collector adds those back.

Labels carry queue names, provider names and ids, outcomes and worker kinds only: never a
recipient, a tenant's data or a secret (the endpoint has no auth, CONTRACT §7).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.db.models.functions import Coalesce, Greatest, Now
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from queueing import stats

PRUNE_ACTION = "retention.prune"
PRUNE_ACTOR = "system:prune"

# Enqueue → delivered, seconds. Console and loopback deliveries land in the first buckets; a
# provider that is down or rate-limited shows up in the last ones.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
LATENCY_WINDOW_SECONDS = 300.0


def _seconds(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value) / 1_000_000  # SQLite hands durations back as microseconds


def _provider_label(provider_id: int | None, names: dict[int, str]) -> tuple[str, str]:
    if provider_id is None:
        return "", ""  # the provider was deleted (attempts keep their rows, provider_id NULL)
    return names.get(provider_id, ""), str(provider_id)


class OmniPostCollector(Collector):
    """Reads every figure from the database on each `collect()` (one scrape)."""

    def __init__(self, *, latency_window: float | None = None, using: str = "default") -> None:
        self.latency_window = float(
            latency_window
            if latency_window is not None
            else getattr(settings, "OMNIPOST_METRICS_LATENCY_WINDOW_SECONDS", LATENCY_WINDOW_SECONDS)
        )
        self.using = using

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        yield from self._queues()
        yield from self._rate_limits()
        yield from self._attempts()
        yield self._latency()
        yield from self._dlq()
        yield self._scheduler_lag()
        yield self._workers()
        scrape = GaugeMetricFamily(
            "omnipost_metrics_scrape_duration_seconds", "Time this scrape spent reading the database."
        )
        scrape.add_metric([], round(time.perf_counter() - started, 6))
        yield scrape

    # --- queue ------------------------------------------------------------------------------------
    def _queues(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "omnipost_queue_depth", "Live items in queue_state by queue and priority.", labels=["queue", "priority"]
        )
        items = GaugeMetricFamily(
            "omnipost_queue_items",
            "Live items by queue and state: ready (claimable now), leased (being delivered), "
            "delayed (waiting for a retry's backoff).",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "omnipost_queue_oldest_ready_age_seconds",
            "Age of the oldest ready item by queue (0 when none is ready).",
            labels=["queue"],
        )
        for q in stats.queue_figures():
            for priority, n in q["by_priority"].items():
                depth.add_metric([q["queue"], priority], n)
            for state in ("ready", "leased", "delayed"):
                items.add_metric([q["queue"], state], q[state])
            oldest.add_metric([q["queue"]], q["oldest_age_seconds"])
        yield from (depth, items, oldest)

    # --- rate limits --------------------------------------------------------------------------------
    def _rate_limits(self) -> Iterator[Metric]:
        from notifications.models import Provider
        from queueing.models import QueueItem, RateBucket

        waiting = GaugeMetricFamily(
            "omnipost_rate_limited_ready_items",
            "Ready items of rate-limited providers, claimed only as fast as their token buckets allow "
            "(deferred by the rate limit while this stays above zero).",
            labels=["provider", "provider_id"],
        )
        # queue_state_lane_idx: WHERE rate_limited, by provider.
        rows = list(
            QueueItem.objects.using(self.using)
            .ready()
            .filter(rate_limited=True)
            .values("provider_id")
            .annotate(n=Count("pk"))
            .order_by("provider_id")
        )
        # Each row carries the database's clock, the one the buckets are refilled on.
        buckets = list(RateBucket.objects.using(self.using).annotate(db_now=Now()).order_by("key"))
        ids = {r["provider_id"] for r in rows if r["provider_id"] is not None}
        ids |= {int(b.key.split(":", 1)[1]) for b in buckets if b.key.startswith("provider:")}
        names = dict(Provider.objects.using(self.using).filter(pk__in=ids).values_list("pk", "name")) if ids else {}
        for r in rows:
            waiting.add_metric(list(_provider_label(r["provider_id"], names)), r["n"])
        yield waiting

        labels = ["scope", "id", "provider"]
        configured = GaugeMetricFamily(
            "omnipost_rate_limit_rate", "Configured rate of a shared token bucket (tokens/s).", labels=labels
        )
        effective = GaugeMetricFamily(
            "omnipost_rate_limit_effective_rate",
            "Adaptive rate of a shared token bucket (tokens/s): lowered on 429s, raised back on success.",
            labels=labels,
        )
        tokens = GaugeMetricFamily(
            "omnipost_rate_limit_tokens", "Tokens a bucket holds now (refilled up to its burst).", labels=labels
        )
        exhausted = GaugeMetricFamily(
            "omnipost_rate_limit_buckets_exhausted",
            "Token buckets holding less than one token now: their lanes wait for the next token.",
        )
        empty = 0
        for bucket in buckets:
            scope, _, key_id = bucket.key.partition(":")
            name = names.get(int(key_id), "") if scope == "provider" and key_id.isdigit() else ""
            elapsed = max(0.0, (bucket.db_now - bucket.updated_at).total_seconds())
            available = min(bucket.burst, bucket.tokens + elapsed * bucket.effective_rate)
            empty += available < 1
            for family, value in ((configured, bucket.rate), (effective, bucket.effective_rate), (tokens, available)):
                family.add_metric([scope, key_id, name], round(value, 6))
        exhausted.add_metric([], empty)
        yield from (configured, effective, tokens, exhausted)

    # --- attempts ------------------------------------------------------------------------------------
    def _attempts(self) -> Iterator[Metric]:
        from notifications.models import AttemptOutcome, DeliveryAttempt, Provider

        totals: dict[tuple[str, int | None], int] = defaultdict(int)
        # The whole table, grouped: see the module docstring for the cost.
        for row in (
            DeliveryAttempt.objects.using(self.using)
            .values("outcome", "provider_id")
            .annotate(n=Count("pk"))
            .order_by()
        ):
            totals[(row["outcome"], row["provider_id"])] += row["n"]
        for (outcome, provider_id), n in pruned_attempts(self.using).items():
            totals[(outcome, provider_id)] += n
        ids = {pid for _, pid in totals if pid is not None}
        names = dict(Provider.objects.using(self.using).filter(pk__in=ids).values_list("pk", "name")) if ids else {}

        attempts = CounterMetricFamily(
            "omnipost_delivery_attempts",
            "Delivery attempts by outcome (delivered, transient_error, permanent_error) and provider.",
            labels=["outcome", "provider", "provider_id"],
        )
        retries = CounterMetricFamily(
            "omnipost_delivery_retries",
            "Attempts that ended in a transient error: each schedules a retry unless its attempts are exhausted.",
            labels=["provider", "provider_id"],
        )
        for (outcome, provider_id), n in sorted(totals.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            name, pid = _provider_label(provider_id, names)
            attempts.add_metric([outcome, name, pid], n)
            if outcome == AttemptOutcome.TRANSIENT_ERROR:
                retries.add_metric([name, pid], n)
        yield from (attempts, retries)

    # --- latency -------------------------------------------------------------------------------------
    def _latency(self) -> Metric:
        from notifications.models import AttemptOutcome, DeliveryAttempt

        # attempt_finished_idx finds the window's delivered attempts; each joins its notification by pk.
        latency = ExpressionWrapper(
            F("finished_at")
            - Greatest("notification__created_at", Coalesce("notification__scheduled_for", "notification__created_at")),
            output_field=DurationField(),
        )
        buckets = {
            f"le_{i}": Count("pk", filter=Q(latency__lte=timedelta(seconds=bound)))
            for i, bound in enumerate(LATENCY_BUCKETS)
        }
        row = (
            DeliveryAttempt.objects.using(self.using)
            .filter(outcome=AttemptOutcome.DELIVERED, finished_at__gte=Now() - timedelta(seconds=self.latency_window))
            .annotate(latency=latency)
            .aggregate(count=Count("pk"), total=Sum("latency"), **buckets)
        )
        family = GaugeHistogramMetricFamily(
            "omnipost_delivery_latency_seconds",
            f"Due (created, or scheduled_for) to delivered, for notifications delivered in the last "
            f"{self.latency_window:g}s (a gauge histogram: read it without rate()).",
            labels=[],
        )
        points = [(f"{b:g}", row[f"le_{i}"]) for i, b in enumerate(LATENCY_BUCKETS)]
        points.append(("+Inf", row["count"]))
        family.add_metric([], points, gsum_value=round(_seconds(row["total"]), 6))
        return family

    # --- DLQ, scheduler, workers --------------------------------------------------------------------
    def _dlq(self) -> Iterator[Metric]:
        size = stats.dlq_open()
        family = GaugeMetricFamily(
            "omnipost_dlq_open",
            "Open dead-letter entries (exact up to 100,000, then the planner's estimate; see omnipost_dlq_open_exact).",
        )
        family.add_metric([], size.count)
        exact = GaugeMetricFamily("omnipost_dlq_open_exact", "1 when omnipost_dlq_open is an exact count.")
        exact.add_metric([], 1 if size.exact else 0)
        yield from (family, exact)

    def _scheduler_lag(self) -> Metric:
        from queueing.scheduler import next_due

        _, seconds = next_due(using=self.using)
        family = GaugeMetricFamily(
            "omnipost_scheduler_lag_seconds",
            "How overdue the oldest due, still pending scheduled job is (0 when none is due).",
        )
        family.add_metric([], round(max(0.0, -seconds), 3) if seconds is not None else 0.0)
        return family

    def _workers(self) -> Metric:
        family = GaugeMetricFamily(
            "omnipost_workers",
            "Registered dispatcher and scheduler processes not stopped, by heartbeat: live or stale "
            "(no heartbeat for OMNIPOST_WORKER_STALE_SECONDS; killed or hung).",
            labels=["kind", "state"],
        )
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for row in stats.workers(limit=10_000):
            counts[(row.worker.kind, "live" if row.alive else "stale")] += 1
        for kind in ("dispatcher", "scheduler"):
            for state in ("live", "stale"):
                family.add_metric([kind, state], counts[(kind, state)])
        return family


def pruned_attempts(using: str = "default") -> dict[tuple[str, int | None], int]:
    """Attempts `prune` removed, per (outcome, provider id), from its `retention.prune` audit events.

    Those events have no tenant, so `audit_tenant_recent_idx` (tenant_id IS NULL) finds them without
    reading the tenants' events.
    """
    from core.models import AuditEvent

    out: dict[tuple[str, int | None], int] = defaultdict(int)
    details = AuditEvent.objects.using(using).filter(tenant__isnull=True, action=PRUNE_ACTION).values_list(
        "details", flat=True
    )
    for detail in details.iterator(chunk_size=2000):
        for outcome, provider_id, n in (detail or {}).get("attempts", []):
            out[(outcome, provider_id)] += int(n)
    return dict(out)


def registry() -> CollectorRegistry:
    """A registry with only OmniPost's collector: per-process figures (GC, memory) would describe
    whichever web process happened to answer, not the system."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(OmniPostCollector())
    return reg


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text (OpenMetrics when the scraper asks for it); 503 when the database is down."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    try:
        body = encoder(registry())
    except DatabaseError as exc:
        return HttpResponse(
            f"# database unavailable: {type(exc).__name__}\n", status=503, content_type="text/plain; charset=utf-8"
        )
    return HttpResponse(body, content_type=content_type)
