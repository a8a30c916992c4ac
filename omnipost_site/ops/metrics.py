"""`/metrics`: Prometheus text read from the database at scrape time.

Every figure lives in the database, so one scrape of any web process describes the whole system
(every dispatcher and scheduler, on any machine) and nothing is lost when a process restarts. A
scrape is a fixed number of queries (about a dozen), none of which reads `delivery_attempts`: its cost
does not grow with history.

- queue depth by queue/priority, ready/leased/delayed, oldest ready age: `queueing.stats.queue_figures()`,
  one grouped scan of `queue_state` (live items only, so it stays small); the OMNIPOST_METRICS_MAX_QUEUES
  (20) deepest queues by name, the rest added up as `queue="other"`;
- rate-limited items waiting for tokens: `queue_state_lane_idx`; token buckets: `rate_limit_buckets`
  (one row per limited provider or tenant), providers' by provider (folded past
  OMNIPOST_METRICS_MAX_PROVIDERS), tenants' added up by scope: no tenant id is ever a label value;
- delivery attempts by outcome and provider, and the due → delivered latency histogram: counters
  (`notifications.counters`) that the dispatcher's record statement adds to per batch, summed over
  their shards: a table of a few rows per provider; providers past OMNIPOST_METRICS_MAX_PROVIDERS
  (200, lowest ids first, so no series ever moves) add up as `provider="other"`;
- open dead letters: `omnipost_site.ops.figures.dlq_open()`, exact up to 100,000, then the planner's estimate;
- scheduler lag: min(run_at) of due pending jobs, `scheduled_jobs_due_idx`;
- fan-outs of workflow triggers to topics: running, chunks still to create, runs created per second
  (`workflows.fanout.figures()`, the running fan-outs' rows only);
- workers live/stale: `queueing.stats.workers()`;
- receipts ignored (unknown, another tenant's, or another provider's notification): `receipt_counters`,
  sharded like the delivery counters, by provider (folded past OMNIPOST_METRICS_MAX_PROVIDERS like the
  attempts).

Counters never go down: nothing subtracts from them, and `prune` deletes attempts, not counters.

Labels carry queue names, provider names and ids, outcomes, bucket scopes and worker kinds only,
each capped in number: never a tenant id, a recipient, a tenant's data or a secret. With
OMNIPOST_METRICS_TOKEN set, a scrape needs `Authorization: Bearer <token>` (401 otherwise).
"""

from __future__ import annotations

import hmac
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from omnipost_site.ops import figures
from queueing import stats

OTHER = "other"  # the label value of what is folded past a cap
MAX_QUEUES = 20
MAX_PROVIDERS = 200


BUCKET_SCOPES = ("provider", "tenant", "api")  # the prefixes of rate_limit_buckets.key


def _bucket_scope(key: str) -> tuple[str, int | None]:
    """A bucket key's scope label (one of BUCKET_SCOPES, else "other") and, for a provider's, its id."""
    scope, _, key_id = key.partition(":")
    if scope == "provider":
        return (scope, int(key_id)) if key_id.isascii() and key_id.isdigit() else (OTHER, None)
    return (scope if scope in BUCKET_SCOPES else OTHER), None


def _provider_label(provider_id: int | None, names: dict[int, str]) -> tuple[str, str]:
    if provider_id is None:
        return "", ""  # the provider was deleted (attempts keep their rows, provider_id NULL)
    return names.get(provider_id, ""), str(provider_id)


class OmniPostCollector(Collector):
    """Reads every figure from the database on each `collect()` (one scrape)."""

    def __init__(self, *, using: str = "default") -> None:
        self.using = using
        self.max_queues = int(getattr(settings, "OMNIPOST_METRICS_MAX_QUEUES", MAX_QUEUES))
        self.max_providers = int(getattr(settings, "OMNIPOST_METRICS_MAX_PROVIDERS", MAX_PROVIDERS))

    def collect(self) -> Iterator[Metric]:
        from notifications import counters

        started = time.perf_counter()
        yield from self._queues()
        yield from self._rate_limits()
        counted = counters.totals(self.using)
        yield from self._attempts(counted)
        yield self._latency(counted)
        yield from self._dlq()
        yield self._scheduler_lag()
        yield from self._fanouts()
        yield self._workers()
        yield self._reconnects()
        yield self._receipts_ignored()
        yield self._circuits()
        scrape = GaugeMetricFamily(
            "omnipost_metrics_scrape_duration_seconds", "Time this scrape spent reading the database."
        )
        scrape.add_metric([], round(time.perf_counter() - started, 6))
        yield scrape

    # --- queue ------------------------------------------------------------------------------------
    def _queues(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "omnipost_queue_depth",
            "Live items in queue_state by queue and priority (past the OMNIPOST_METRICS_MAX_QUEUES deepest "
            "queues, queue=\"other\").",
            labels=["queue", "priority"],
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
        for q in fold_queues(stats.queue_figures(), self.max_queues):
            for priority, n in q["by_priority"].items():
                depth.add_metric([q["queue"], priority], n)
            for state in ("ready", "leased", "delayed"):
                items.add_metric([q["queue"], state], q[state])
            oldest.add_metric([q["queue"]], q["oldest_age_seconds"])
        yield from (depth, items, oldest)

    def _circuits(self) -> Metric:
        """Breakers that are not closed (closed ones have no series), lowest provider ids first, at most
        OMNIPOST_METRICS_MAX_PROVIDERS of them: one query of the small provider_circuits table."""
        from providers.models import Provider
        from routing import circuits

        metric = GaugeMetricFamily(
            "omnipost_provider_circuit_state",
            "1 for each provider whose circuit breaker is open or half_open (state label); closed breakers "
            "have no series.",
            labels=["provider", "provider_id", "state"],
        )
        states = sorted(circuits.not_closed().items())[: self.max_providers]
        names = dict(Provider.objects.filter(pk__in=[pid for pid, _ in states]).values_list("pk", "name"))
        for provider_id, state in states:
            metric.add_metric([names.get(provider_id, ""), str(provider_id), state], 1)
        return metric

    # --- rate limits --------------------------------------------------------------------------------
    def _rate_limits(self) -> Iterator[Metric]:
        from providers.models import Provider
        from queueing.models import QueueItem, RateBucket

        waiting = GaugeMetricFamily(
            "omnipost_rate_limited_ready_items",
            "Ready items of rate-limited providers, claimed only as fast as their token buckets allow "
            "(deferred by the rate limit while this stays above zero; past OMNIPOST_METRICS_MAX_PROVIDERS, "
            "provider=\"other\").",
            labels=["provider", "provider_id"],
        )
        # queue_state_lane_idx: WHERE ready AND rate_limited, by provider (without `ready`, a scan of
        # the whole queue).
        rows = list(
            QueueItem.objects.using(self.using)
            .ready()
            .filter(ready=True, rate_limited=True)
            .values("provider_id")
            .annotate(n=Count("pk"))
            .order_by("provider_id")
        )
        # Each row carries the database's clock, the one the buckets are refilled on.
        buckets = list(RateBucket.objects.using(self.using).annotate(db_now=Now()).order_by("key"))
        provider_ids = {r["provider_id"] for r in rows if r["provider_id"] is not None}
        provider_ids |= {int(b.key.split(":", 1)[1]) for b in buckets if _bucket_scope(b.key)[0] == "provider"}
        # The lowest ids keep their own series (new providers get higher ids, so no series ever moves).
        named = sorted(provider_ids)[: self.max_providers]
        names = dict(Provider.objects.using(self.using).filter(pk__in=named).values_list("pk", "name")) if named else {}
        shown: dict[tuple[str, str], int] = defaultdict(int)
        for r in rows:
            shown[self._provider_or_other(r["provider_id"], names)] += r["n"]
        for labels, n in sorted(shown.items()):
            waiting.add_metric(list(labels), n)
        yield waiting

        # Tenants' buckets (the API's `api:<tenant>`, the dispatcher's `tenant:<tenant>`) are added up by
        # scope: /metrics may be read without a token, and a tenant id is neither a public value nor a
        # bounded one. Providers' keep their own series, up to OMNIPOST_METRICS_MAX_PROVIDERS.
        labels = ["scope", "id", "provider"]
        configured = GaugeMetricFamily(
            "omnipost_rate_limit_rate",
            "Configured rate of shared token buckets (tokens/s): by provider (past OMNIPOST_METRICS_MAX_PROVIDERS, "
            "id=\"other\"), tenants' added up by scope (id empty).",
            labels=labels,
        )
        effective = GaugeMetricFamily(
            "omnipost_rate_limit_effective_rate",
            "Adaptive rate of shared token buckets (tokens/s): lowered on 429s, raised back on success.",
            labels=labels,
        )
        tokens = GaugeMetricFamily(
            "omnipost_rate_limit_tokens",
            "Tokens shared buckets hold now (refilled up to their burst), labelled like omnipost_rate_limit_rate.",
            labels=labels,
        )
        counted = GaugeMetricFamily(
            "omnipost_rate_limit_buckets", "Shared token buckets by scope (provider, tenant, api).", labels=["scope"]
        )
        exhausted = GaugeMetricFamily(
            "omnipost_rate_limit_buckets_exhausted",
            "Token buckets holding less than one token now: their lanes wait for the next token.",
        )
        empty = 0
        sums: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        per_scope: dict[str, int] = dict.fromkeys(BUCKET_SCOPES, 0)
        for bucket in buckets:
            scope, provider_id = _bucket_scope(bucket.key)
            elapsed = max(0.0, (bucket.db_now - bucket.updated_at).total_seconds())
            available = min(bucket.burst, bucket.tokens + elapsed * bucket.effective_rate)
            empty += available < 1
            per_scope[scope] = per_scope.get(scope, 0) + 1
            if scope == "provider":
                name, key_id = self._provider_or_other(provider_id, names)
                key = (scope, key_id, name)
            else:
                key = (scope, "", "")
            total = sums[key]
            total[0] += bucket.rate
            total[1] += bucket.effective_rate
            total[2] += available
        for key, (rate, effective_rate, available) in sorted(sums.items()):
            for family, value in ((configured, rate), (effective, effective_rate), (tokens, available)):
                family.add_metric(list(key), round(value, 6))
        for scope, n in per_scope.items():
            counted.add_metric([scope], n)
        exhausted.add_metric([], empty)
        yield from (configured, effective, tokens, counted, exhausted)

    def _provider_or_other(self, provider_id: int | None, names: dict[int, str]) -> tuple[str, str]:
        """(name, id) labels of a provider among `names` (the capped ones), else ("other", "other")."""
        if provider_id is not None and provider_id not in names:
            return OTHER, OTHER
        return _provider_label(provider_id, names)

    # --- attempts ------------------------------------------------------------------------------------
    def _attempts(self, totals: dict[tuple[int, str, int], tuple[int, float]]) -> Iterator[Metric]:
        from notifications import counters
        from notifications.models import AttemptOutcome
        from providers.models import Provider

        ids = sorted({pid for pid, outcome, _ in totals if outcome != counters.LATENCY and pid})
        # The lowest ids keep a series of their own, the rest add up in `other`: counters only ever
        # gain providers, and new providers get higher ids, so no series ever moves (and goes down).
        named, folded = ids[: self.max_providers], set(ids[self.max_providers :])
        names = dict(Provider.objects.using(self.using).filter(pk__in=named).values_list("pk", "name")) if named else {}

        attempts = CounterMetricFamily(
            "omnipost_delivery_attempts",
            "Delivery attempts by outcome (delivered, transient_error, permanent_error) and provider "
            "(past OMNIPOST_METRICS_MAX_PROVIDERS, provider=\"other\").",
            labels=["outcome", "provider", "provider_id"],
        )
        retries = CounterMetricFamily(
            "omnipost_delivery_retries",
            "Attempts that ended in a transient error: each schedules a retry unless its attempts are exhausted.",
            labels=["provider", "provider_id"],
        )
        by_label: dict[tuple[str, str, str], int] = defaultdict(int)
        for (provider_id, outcome, le), (n, _) in totals.items():
            if le != counters.ATTEMPTS:
                continue
            if provider_id in folded:
                name, pid = OTHER, OTHER
            else:
                name, pid = _provider_label(provider_id or None, names)
            by_label[(outcome, name, pid)] += n
        for (outcome, name, pid), n in sorted(by_label.items()):
            attempts.add_metric([outcome, name, pid], n)
            if outcome == AttemptOutcome.TRANSIENT_ERROR:
                retries.add_metric([name, pid], n)
        yield from (attempts, retries)

    # --- latency -------------------------------------------------------------------------------------
    def _latency(self, totals: dict[tuple[int, str, int], tuple[int, float]]) -> Metric:
        from notifications import counters

        per_bucket = [0] * (len(counters.LATENCY_BUCKETS) + 1)
        total = 0.0
        for (_, outcome, le), (n, seconds) in totals.items():
            if outcome == counters.LATENCY and 0 <= le < len(per_bucket):
                per_bucket[le] += n
                total += seconds
        family = HistogramMetricFamily(
            "omnipost_delivery_latency_seconds",
            "Due (created, or scheduled_for) to delivered, seconds: a histogram of every delivery "
            "(read it with rate()/increase()).",
            labels=[],
        )
        cumulative, points = 0, []
        for bound, n in zip([*(f"{b:g}" for b in counters.LATENCY_BUCKETS), "+Inf"], per_bucket, strict=True):
            cumulative += n
            points.append((bound, cumulative))
        family.add_metric([], points, sum_value=round(total, 6))
        return family

    # --- DLQ, scheduler, workers --------------------------------------------------------------------
    def _dlq(self) -> Iterator[Metric]:
        size = figures.dlq_open()
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

    def _fanouts(self) -> Iterator[Metric]:
        from workflows import fanout

        running, chunks, rate = fanout.figures(self.using)
        families = (
            ("omnipost_fanouts_running", "Workflow triggers to a topic still fanning out.", running),
            ("omnipost_fanout_pending_chunks", "Chunks of runs the running fan-outs have still to create.", chunks),
            ("omnipost_fanout_rows_per_second",
             "Runs the running fan-outs created per second, each since its trigger (summed).", round(rate, 3)),
        )  # fmt: skip
        for name, help_text, value in families:
            family = GaugeMetricFamily(name, help_text)
            family.add_metric([], value)
            yield family

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

    def _reconnects(self) -> Metric:
        from django.db.models import Sum

        from queueing.models import Worker

        family = CounterMetricFamily(
            "omnipost_db_reconnects",
            "Times a dispatcher or scheduler dropped a lost database session and reconnected, as their "
            "heartbeats last reported (core.db_faults).",
            labels=["kind"],
        )
        totals = dict(Worker.objects.using(self.using).values_list("kind").annotate(n=Sum("reconnects")).order_by())
        for kind in ("dispatcher", "scheduler"):
            family.add_metric([kind], totals.get(kind) or 0)
        return family

    def _receipts_ignored(self) -> Metric:
        from providers.models import Provider
        from receipts.services import ignored_totals

        family = CounterMetricFamily(
            "omnipost_receipts_ignored",
            "Provider receipts acknowledged but not applied: for no known notification (reason=\"unknown\"), "
            "for another tenant's (reason=\"foreign\"), or for one the reporting provider did not send "
            "(reason=\"other_provider\"), by the provider that reported them.",
            labels=["provider", "provider_id", "reason"],
        )
        totals = ignored_totals(self.using)
        ids = sorted({pid for pid, _ in totals})
        named, folded = ids[: self.max_providers], set(ids[self.max_providers :])
        names = dict(Provider.objects.using(self.using).filter(pk__in=named).values_list("pk", "name")) if named else {}
        by_label: dict[tuple[str, str, str], int] = defaultdict(int)
        for (pid, reason), n in totals.items():
            name, label = (OTHER, OTHER) if pid in folded else (names.get(pid, ""), str(pid))
            by_label[(name, label, reason)] += n
        for labels, n in sorted(by_label.items()):
            family.add_metric(list(labels), n)
        return family


def fold_queues(figures: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    """The `cap` deepest queues (ties by name) as they are, the rest added up as one queue `other`:
    queue names are the tenants' choice, label values must stay few."""
    if len(figures) <= cap:
        return figures
    deepest = sorted(figures, key=lambda q: (-q["depth"], q["queue"]))
    kept, rest = deepest[:cap], deepest[cap:]
    other = stats.totals(rest)
    other["queue"] = OTHER
    same = next((q for q in kept if q["queue"] == OTHER), None)  # a tenant's queue named "other"
    if same is not None:
        kept.remove(same)
        other = stats.totals([same, other]) | {"queue": OTHER}
    return [*kept, other]


def registry() -> CollectorRegistry:
    """A registry with only OmniPost's collector: per-process figures (GC, memory) would describe
    whichever web process happened to answer, not the system."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(OmniPostCollector())
    return reg


def _authorised(request: HttpRequest) -> bool:
    token = getattr(settings, "OMNIPOST_METRICS_TOKEN", "") or ""
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # Compared in constant time, as bytes (compare_digest refuses non-ASCII str).
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text (OpenMetrics when the scraper asks for it); 503 when the database is down;
    401 without the bearer token when OMNIPOST_METRICS_TOKEN is set."""
    if not _authorised(request):
        response = HttpResponse(
            "# unauthorised: send Authorization: Bearer <OMNIPOST_METRICS_TOKEN>\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    try:
        body = encoder(registry())
    except DatabaseError as exc:
        return HttpResponse(
            f"# database unavailable: {type(exc).__name__}\n", status=503, content_type="text/plain; charset=utf-8"
        )
    return HttpResponse(body, content_type=content_type)
