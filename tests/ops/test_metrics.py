"""/metrics: every figure read from the database at scrape time, and counters that add up while real
dispatcher processes deliver."""

from __future__ import annotations

import uuid
from datetime import timedelta
from unittest import mock

import pytest
from django.db import OperationalError, connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from core.models import Tenant
from dispatch.delivery import Attempt, Outcome, claim_and_start, record_outcomes
from dlq.models import DeadLetter
from notifications import counters
from notifications.counters import DeliveryCounter
from notifications.models import DeliveryAttempt, Notification
from omnipost_site.ops.metrics import OmniPostCollector
from queueing.models import QueueItem, RateBucket, ScheduledJob, Worker
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

EMAIL = "jane.doe@example.com"
WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for n, lab, v in samples(text) if n == name and all(lab.get(k) == x for k, x in labels.items()))


def scrape(**headers: str) -> str:
    response = Client().get("/metrics", **headers)
    assert response.status_code == 200, response.content
    return response.content.decode()


def analyze_queue_state() -> None:
    """Statistics for the rows in queue_state now. The queue figures are exact only while pg_class says the
    table is small, and a test that filled it (tests/queueing/test_claim_isolation.py, 400,000 rows
    rolled back, autovacuum off) leaves its pages and row estimate behind: without this the figures
    would be sampled from a mostly dead table."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queue_state")


def record(outcomes: dict[Notification, tuple[str, str]]) -> None:
    """Claim every ready item and record, through the dispatcher's record statement, the given
    (kind, attempt outcome) for each of those notifications: how counters grow in production."""
    prepared, skipped = claim_and_start(1000, lease_seconds=60)
    assert not skipped and {p.notification_id for p in prepared} == {n.pk for n in outcomes}
    by_id = {n.pk: outcome for n, outcome in outcomes.items()}
    now = timezone.now()
    record_outcomes([
        Outcome(p.lease, kind, Attempt(p.attempt_number, now, now, result))
        for p in prepared for kind, result in [by_id[p.notification_id]]
    ])  # fmt: skip


@pytest.fixture
def populated(tenant_a, tenant_b):
    """Queue items in two queues, attempts for two providers, dead letters, a late job, a bucket, workers."""
    hook = factories.provider(tenant_a, "hook-a", secrets={"signing_secret": WHSEC})
    mail = factories.provider(tenant_b, "mail-b", kind="console", channel="email", config={})
    # Attempts through the record statement (the counters come from it, not from delivery_attempts).
    sent = factories.queued(tenant_a, hook, 5, recipient=EMAIL)
    mailed = factories.queued(tenant_b, mail, 3, recipient=EMAIL, queue_name="mail")
    failed = factories.queued(tenant_b, mail, 2, recipient=EMAIL, queue_name="mail")
    scheduled = factories.queued(tenant_a, hook, 1, recipient=EMAIL)[0]
    # Latency, due → delivered: 0.2 s, 3 s, 120 s, two days (beyond the last bound); one scheduled (due
    # at scheduled_for, 1 s); the other four ≈ 0 s. Relative to the database's clock: the record
    # statement's delivered_at is its now(), which in this test's transaction is the transaction's
    # start, before this line (Python's clock here made the 0.2 s one ≈ 0 s after a slow setup).
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        [(now,)] = cursor.fetchall()
    for n, seconds in zip(sent[:4], (0.2, 3, 120, 2 * 86400), strict=True):
        Notification.objects.filter(pk=n.pk).update(created_at=now - timedelta(seconds=seconds))
    Notification.objects.filter(pk=scheduled.pk).update(scheduled_for=now - timedelta(seconds=1),
                                                        created_at=now - timedelta(hours=1))
    record({**{n: ("delivered", "delivered") for n in [*sent, scheduled, *mailed[1:]]},
            mailed[0]: ("retry", "transient_error"), failed[0]: ("retry", "transient_error"),
            failed[1]: ("failed", "permanent_error")})  # fmt: skip
    record({mailed[0]: ("delivered", "delivered"), failed[0]: ("failed", "permanent_error")})
    DeadLetter.objects.update(failure_reason=f"410 for {EMAIL}")
    DeadLetter.objects.filter(notification=failed[1]).update(status="discarded")

    factories.queued(tenant_a, hook, 3, priority=9)
    factories.queued(tenant_a, hook, 2, priority=1, queue_name="bulk")
    factories.queued(tenant_b, mail, 1, priority=5, delay=600)  # delayed: a retry's backoff
    factories.queued(tenant_a, hook, 4, rate_limited=True)  # waiting for tokens
    old = timezone.now() - timedelta(seconds=42)
    QueueItem.objects.filter(queue_name="default", priority=9).update(enqueued_at=old)
    late = factories.notifications(tenant_a, hook, 1, status="scheduled")[0]
    ScheduledJob.objects.create(tenant=tenant_a, notification_id=late.pk, run_at=now - timedelta(seconds=90))
    Worker.objects.create(kind="dispatcher", host="h1", pid=1)
    Worker.objects.create(kind="dispatcher", host="h2", pid=2)
    Worker.objects.create(kind="scheduler", host="h1", pid=3)
    Worker.objects.filter(pid=2).update(last_seen=now - timedelta(minutes=10))
    Worker.objects.create(kind="dispatcher", host="h3", pid=4, stopped_at=now)  # stopped: not listed
    # Lowered to 0.3/s by 429s and empty: it needs more than 3 s to hold a whole token again.
    RateBucket.objects.create(key=f"provider:{hook.pk}", rate=10, effective_rate=0.3, burst=10, tokens=0,
                              updated_at=timezone.now())
    analyze_queue_state()
    return {"hook": hook, "mail": mail}


@pytest.mark.django_db
def test_every_figure_comes_from_the_database(populated, django_assert_max_num_queries):
    hook, mail = populated["hook"], populated["mail"]
    with django_assert_max_num_queries(13):
        text = scrape()

    assert metric_value(text, "omnipost_queue_depth", queue="default", priority="9") == 3
    assert metric_value(text, "omnipost_queue_depth", queue="default", priority="5") == 5  # 4 limited + 1 delayed
    assert metric_value(text, "omnipost_queue_depth", queue="bulk", priority="1") == 2
    assert metric_value(text, "omnipost_queue_depth") == 10
    assert metric_value(text, "omnipost_queue_items", queue="default", state="delayed") == 1
    assert metric_value(text, "omnipost_queue_items", queue="default", state="ready") == 7
    assert 37 <= metric_value(text, "omnipost_queue_oldest_ready_age_seconds", queue="default") < 60

    assert metric_value(text, "omnipost_rate_limited_ready_items", provider="hook-a", provider_id=str(hook.pk)) == 4
    assert metric_value(text, "omnipost_rate_limit_effective_rate", scope="provider", provider="hook-a") == 0.3
    assert metric_value(text, "omnipost_rate_limit_rate", scope="provider", id=str(hook.pk)) == 10
    assert metric_value(text, "omnipost_rate_limit_buckets_exhausted") == 1

    attempts = "omnipost_delivery_attempts_total"
    assert metric_value(text, attempts, outcome="delivered", provider="hook-a", provider_id=str(hook.pk)) == 6
    assert metric_value(text, attempts, outcome="delivered", provider="mail-b") == 3
    assert metric_value(text, attempts, outcome="transient_error") == 2
    assert metric_value(text, attempts, outcome="permanent_error", provider_id=str(mail.pk)) == 2
    assert metric_value(text, "omnipost_delivery_retries_total", provider="mail-b") == 2

    # Every delivery, ever: four ≈ 0 s, 0.2 s, 1 s (scheduled: counted from scheduled_for, not
    # created_at), 3 s, 120 s and two days.
    bucket = "omnipost_delivery_latency_seconds_bucket"
    assert metric_value(text, bucket, le="0.05") == 4
    assert metric_value(text, bucket, le="0.25") == 5
    assert metric_value(text, bucket, le="1") == 6
    assert metric_value(text, bucket, le="2.5") == 6
    assert metric_value(text, bucket, le="5") == 7
    assert metric_value(text, bucket, le="60") == 7
    assert metric_value(text, bucket, le="300") == metric_value(text, bucket, le="3600") == 8
    assert metric_value(text, bucket, le="+Inf") == metric_value(text, "omnipost_delivery_latency_seconds_count") == 9
    assert metric_value(text, "omnipost_delivery_latency_seconds_sum") == pytest.approx(124.2 + 2 * 86400, abs=0.5)

    assert metric_value(text, "omnipost_dlq_open") == 1
    assert metric_value(text, "omnipost_dlq_open_exact") == 1
    # The database clock is the transaction's start here, a moment before the test's own now().
    assert 85 <= metric_value(text, "omnipost_scheduler_lag_seconds") < 120
    assert metric_value(text, "omnipost_workers", kind="dispatcher", state="live") == 1
    assert metric_value(text, "omnipost_workers", kind="dispatcher", state="stale") == 1
    assert metric_value(text, "omnipost_workers", kind="scheduler", state="live") == 1

    # Never a recipient or a secret: labels are queue and provider names/ids, outcomes, kinds.
    assert EMAIL not in text and WHSEC not in text and "410 for" not in text
    label_names = {k for _, labels, _ in samples(text) for k in labels}
    assert label_names <= {"queue", "priority", "state", "provider", "provider_id", "outcome", "scope", "id",
                           "kind", "le"}


@pytest.mark.django_db
def test_openmetrics_on_request_and_a_histogram(populated):
    response = Client().get("/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response["Content-Type"].startswith("application/openmetrics-text")
    text = response.content.decode()
    assert "# TYPE omnipost_delivery_latency_seconds histogram" in text
    assert "# TYPE omnipost_delivery_attempts counter" in text
    assert text.rstrip().endswith("# EOF")
    plain = scrape()
    assert plain.startswith("# HELP") and "# EOF" not in plain


@pytest.mark.django_db
def test_empty_database_and_no_auth():
    text = scrape()
    assert metric_value(text, "omnipost_queue_depth") == 0
    assert metric_value(text, "omnipost_dlq_open") == 0
    assert metric_value(text, "omnipost_delivery_latency_seconds_count") == 0
    assert metric_value(text, "omnipost_delivery_attempts_total") == 0
    assert Client().post("/metrics").status_code == 405
    assert "no-cache" in Client().get("/metrics")["Cache-Control"]


@pytest.mark.django_db
def test_database_down_is_503_not_a_traceback():
    with mock.patch.object(OmniPostCollector, "_queues", side_effect=OperationalError("connection refused")):
        response = Client().get("/metrics")
    assert response.status_code == 503
    assert response.content.decode().startswith("# database unavailable: OperationalError")


# --- counters, cost, labels, token --------------------------------------------------------------------


def attempts_by_outcome(text: str, **labels: str) -> dict[str, float]:
    return {o: metric_value(text, "omnipost_delivery_attempts_total", outcome=o, **labels)
            for o in ("delivered", "transient_error", "permanent_error")}  # fmt: skip


@pytest.mark.django_db
def test_counters_grow_per_outcome_as_batches_are_recorded(tenant_a):
    hook = factories.provider(tenant_a, "hook-a")
    first = factories.queued(tenant_a, hook, 6)
    assert attempts_by_outcome(scrape()) == {"delivered": 0, "transient_error": 0, "permanent_error": 0}

    record({**{n: ("delivered", "delivered") for n in first[:3]}, first[3]: ("retry", "transient_error"),
            first[4]: ("failed", "permanent_error"), first[5]: ("dead_lettered", "transient_error")})  # fmt: skip
    text = scrape()
    assert attempts_by_outcome(text, provider="hook-a", provider_id=str(hook.pk)) == {
        "delivered": 3, "transient_error": 2, "permanent_error": 1}  # fmt: skip
    assert metric_value(text, "omnipost_delivery_retries_total", provider="hook-a") == 2
    assert metric_value(text, "omnipost_delivery_latency_seconds_count") == 3

    # The retry delivered, a deferral (no attempt) and an outcome whose lease a peer took: only the
    # first counts; nothing goes down.
    second = factories.queued(tenant_a, hook, 2)
    prepared, _ = claim_and_start(10, lease_seconds=60)
    now = timezone.now()
    by_id = {p.notification_id: p for p in prepared}
    stolen = by_id[second[1].pk].lease
    stolen.lock_token = uuid.uuid4()
    record_outcomes([
        Outcome(by_id[first[3].pk].lease, "delivered", Attempt(2, now, now, "delivered")),
        Outcome(by_id[second[0].pk].lease, "deferred"),
        Outcome(stolen, "delivered", Attempt(1, now, now, "delivered")),
    ])  # fmt: skip
    text = scrape()
    assert attempts_by_outcome(text) == {"delivered": 4, "transient_error": 2, "permanent_error": 1}
    assert metric_value(text, "omnipost_delivery_latency_seconds_count") == 4
    assert DeliveryAttempt.objects.count() == 7  # the counters agree with the rows written


@pytest.mark.django_db
def test_counters_spread_over_shards_and_add_up(tenant_a):
    """Each session adds to its own shard (pg_backend_pid() % SHARDS); a scrape sums them."""
    hook = factories.provider(tenant_a, "hook-a")
    record({n: ("delivered", "delivered") for n in factories.queued(tenant_a, hook, 2)})
    DeliveryCounter.objects.filter(outcome="delivered").update(shard=(F("shard") + 1) % counters.SHARDS)
    record({n: ("delivered", "delivered") for n in factories.queued(tenant_a, hook, 3)})
    assert DeliveryCounter.objects.filter(outcome="delivered").count() == 2
    assert attempts_by_outcome(scrape())["delivered"] == 5


@pytest.mark.django_db
def test_a_scrape_costs_the_same_whatever_delivery_attempts_holds(populated, tenant_a):
    """The same statements before and after 50,000 more attempt rows, none of which reads them."""
    with CaptureQueriesContext(connection) as before:
        text_before = scrape()
    one = Notification.objects.filter(status="delivered").first()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at, finished_at,
                                           outcome, error_class, error_code, error_message, duration_ms)
            SELECT %s, %s, 100 + i, %s, now(), now(), 'delivered', '', '', '', 1 FROM generate_series(1, 50000) i
            """,
            [one.tenant_id, one.pk, one.provider_id],
        )
        cursor.execute("ANALYZE delivery_attempts")
    assert DeliveryAttempt.objects.count() > 50_000
    with CaptureQueriesContext(connection) as after:
        text_after = scrape()

    statements = [q["sql"] for q in after.captured_queries]
    assert statements == [q["sql"] for q in before.captured_queries] and 5 <= len(statements) <= 13, len(statements)
    for sql in statements:
        assert "delivery_attempts" not in sql
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "delivery_attempts" not in plan and "attempt_finished_idx" not in plan, plan
    # Rows written outside the record statement are not counted: the figure is the counters'.
    assert attempts_by_outcome(text_after) == attempts_by_outcome(text_before)


@pytest.mark.django_db
def test_queue_and_provider_labels_are_capped(tenant_a, settings):
    settings.OMNIPOST_METRICS_MAX_QUEUES = 20
    settings.OMNIPOST_METRICS_MAX_PROVIDERS = 2
    hooks = [factories.provider(tenant_a, f"hook-{i}") for i in range(3)]
    for i, hook in enumerate(hooks):
        record({n: ("delivered", "delivered") for n in factories.queued(tenant_a, hook, i + 1)})
    for i in range(25):  # q00 holds 1 item … q24 holds 25
        factories.queued(tenant_a, hooks[0], i + 1, queue_name=f"q{i:02d}")
    factories.queued(tenant_a, hooks[0], 1, queue_name="other")  # a tenant's own queue named "other"
    analyze_queue_state()

    text = scrape()
    queues = {lab["queue"] for name, lab, _ in samples(text) if name == "omnipost_queue_depth"}
    assert queues == {f"q{i:02d}" for i in range(5, 25)} | {"other"}
    assert metric_value(text, "omnipost_queue_depth", queue="other") == 1 + 2 + 3 + 4 + 5 + 1
    assert metric_value(text, "omnipost_queue_depth") == sum(range(1, 26)) + 1
    assert metric_value(text, "omnipost_queue_items", queue="other", state="ready") == 16

    delivered = {(lab["provider"], lab["provider_id"]): v for name, lab, v in samples(text)
                 if name == "omnipost_delivery_attempts_total" and lab["outcome"] == "delivered"}  # fmt: skip
    assert delivered == {("hook-0", str(hooks[0].pk)): 1, ("hook-1", str(hooks[1].pk)): 2, ("other", "other"): 3}


@pytest.mark.django_db
def test_bearer_token_when_configured(settings):
    assert Client().get("/metrics").status_code == 200  # no token configured: open, as before
    settings.OMNIPOST_METRICS_TOKEN = "metrics-token-0123456789"
    for value in (None, "Bearer wrong", "Basic metrics-token-0123456789", "Bearer metrics-token-012345678",
                  "Bearer métrics"):
        headers = {"HTTP_AUTHORIZATION": value} if value else {}
        response = Client().get("/metrics", **headers)
        assert response.status_code == 401, headers
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert b"omnipost_" not in response.content
    assert "omnipost_queue_depth" in scrape(HTTP_AUTHORIZATION="Bearer metrics-token-0123456789")


# --- real processes ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_counters_add_up_while_two_dispatchers_deliver(tenant_a, subprocess_env, tmp_path):
    good, bad = 1500, 300
    with (
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120, delay_ms=20) as ok,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120, status=400) as gone,
    ):
        hook = factories.provider(tenant_a, "ok", config={"url": ok.url},
                                  secrets={"signing_secret": TEST_SIGNING_SECRET})
        refusing = factories.provider(tenant_a, "refusing", config={"url": gone.url},
                                      secrets={"signing_secret": TEST_SIGNING_SECRET})
        factories.queued(tenant_a, hook, good)
        factories.queued(tenant_a, refusing, bad)
        procs = start_dispatchers(2, subprocess_env, "--batch-size", "10", "--concurrency", "10", log_dir=tmp_path)
        try:
            assert wait_started(tmp_path, 2)
            seen: list[tuple[float, float]] = []

            def scraped_done() -> bool:
                text = scrape()
                delivered = metric_value(text, "omnipost_delivery_attempts_total", outcome="delivered")
                refused = metric_value(text, "omnipost_delivery_attempts_total", outcome="permanent_error")
                seen.append((delivered, refused))
                if len(seen) == 2:
                    assert metric_value(text, "omnipost_workers", kind="dispatcher", state="live") == 2
                return delivered + refused == good + bad

            assert wait_until(scraped_done, 90, interval=0.05)
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 20) == [0, 0]

    mid_run = [s for s in seen if 0 < s[0] < good]
    assert mid_run, f"no scrape landed mid-run: {seen[:3]}…{seen[-3:]}"
    assert all(a <= b for a, b in zip([s[0] for s in seen], [s[0] for s in seen[1:]], strict=False)), "monotonic"
    text = scrape()
    delivered = Notification.objects.filter(status="delivered").count()
    assert delivered == good == len({r.webhook_id for r in ok.requests if r.status == 200})
    assert metric_value(text, "omnipost_delivery_attempts_total", outcome="delivered", provider="ok") == delivered
    assert metric_value(text, "omnipost_delivery_attempts_total", outcome="permanent_error", provider="refusing") == bad
    assert metric_value(text, "omnipost_delivery_attempts_total", outcome="transient_error") == 0
    assert metric_value(text, "omnipost_delivery_latency_seconds_count") == delivered
    assert metric_value(text, "omnipost_dlq_open") == bad
    assert metric_value(text, "omnipost_queue_depth") == 0
    assert QueueItem.objects.count() == 0
    assert metric_value(text, "omnipost_workers", kind="dispatcher", state="live") == 0  # stopped cleanly


@pytest.mark.django_db
def test_database_reconnects_reported_by_heartbeats_are_counted():
    from core import db_faults
    from queueing import heartbeat

    assert metric_value(scrape(), "omnipost_db_reconnects_total") == 0
    dispatcher = heartbeat.register("dispatcher", ["*"])
    scheduler = heartbeat.register("scheduler")
    heartbeat.beat(dispatcher, 0, reconnects=db_faults.reconnects() + 3)
    heartbeat.beat(scheduler, 0, reconnects=2)
    text = scrape()
    assert metric_value(text, "omnipost_db_reconnects_total", kind="dispatcher") == db_faults.reconnects() + 3
    assert metric_value(text, "omnipost_db_reconnects_total", kind="scheduler") == 2


@pytest.mark.django_db
def test_no_tenant_id_in_the_unauthenticated_scrape_and_bucket_labels_are_bounded(tenant_a, tenant_b, settings):
    """/metrics needs no token by default: tenants' API and dispatch buckets are added up by scope, and
    providers' buckets (and waiting items) past OMNIPOST_METRICS_MAX_PROVIDERS fold into "other"."""
    settings.OMNIPOST_METRICS_MAX_PROVIDERS = 2
    settings.OMNIPOST_METRICS_TOKEN = ""
    now = timezone.now()
    hooks = [factories.provider(tenant_a, f"hook-{i}") for i in range(4)]
    for hook in hooks:
        RateBucket.objects.create(key=f"provider:{hook.pk}", rate=10, effective_rate=10, burst=10, tokens=10,
                                  updated_at=now)  # fmt: skip
        factories.queued(tenant_a, hook, 1, rate_limited=True)
    many = [tenant_a, tenant_b, *(Tenant.objects.create(name=f"t{i}") for i in range(30))]
    for tenant in many:
        for scope in ("api", "tenant"):
            RateBucket.objects.create(key=f"{scope}:{tenant.pk}", rate=2, effective_rate=2, burst=5, tokens=5,
                                      updated_at=now)  # fmt: skip
    analyze_queue_state()

    text = scrape()
    assert not any(str(t.pk) in text or str(t.pk).replace("-", "") in text for t in many)
    for name in ("omnipost_rate_limit_rate", "omnipost_rate_limit_effective_rate", "omnipost_rate_limit_tokens"):
        series = {(lab["scope"], lab["id"], lab["provider"]) for n, lab, _ in samples(text) if n == name}
        assert series == {("provider", str(hooks[0].pk), "hook-0"), ("provider", str(hooks[1].pk), "hook-1"),
                          ("provider", "other", "other"), ("api", "", ""), ("tenant", "", "")}  # fmt: skip
    assert metric_value(text, "omnipost_rate_limit_tokens", scope="api") == 5 * len(many)
    assert metric_value(text, "omnipost_rate_limit_rate", scope="provider", id="other") == 20
    assert metric_value(text, "omnipost_rate_limit_buckets", scope="api") == len(many)
    assert metric_value(text, "omnipost_rate_limit_buckets", scope="provider") == 4
    waiting = {lab["provider_id"]: v for n, lab, v in samples(text) if n == "omnipost_rate_limited_ready_items"}
    assert waiting == {str(hooks[0].pk): 1, str(hooks[1].pk): 1, "other": 2}
    # Every label value of the whole scrape comes from a bounded set.
    values = {v for _, labels, _ in samples(text) for k, v in labels.items() if k not in ("le",)}
    assert len(values) < 40
