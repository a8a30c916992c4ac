"""/metrics: every figure read from the database at scrape time, and counters that add up while real
dispatcher processes deliver."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.db import OperationalError
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from core.metrics import OmniPostCollector
from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt, Notification
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


def attempt(notification: Notification, number: int, outcome: str) -> DeliveryAttempt:
    now = timezone.now()
    return DeliveryAttempt(
        tenant_id=notification.tenant_id, notification=notification, number=number,
        provider_id=notification.provider_id, started_at=now, finished_at=now, outcome=outcome,
    )  # fmt: skip


@pytest.fixture
def populated(tenant_a, tenant_b):
    """Queue items in two queues, attempts for two providers, dead letters, a late job, a bucket, workers."""
    hook = factories.provider(tenant_a, "hook-a", secrets={"signing_secret": WHSEC})
    mail = factories.provider(tenant_b, "mail-b", kind="console", channel="email", config={})
    factories.queued(tenant_a, hook, 3, priority=9)
    factories.queued(tenant_a, hook, 2, priority=1, queue_name="bulk")
    factories.queued(tenant_b, mail, 1, priority=5, delay=600)  # delayed: a retry's backoff
    factories.queued(tenant_a, hook, 4, rate_limited=True)  # waiting for tokens
    old = timezone.now() - timedelta(seconds=42)
    QueueItem.objects.filter(queue_name="default", priority=9).update(enqueued_at=old)

    sent = factories.notifications(tenant_a, hook, 5, status="delivered", recipient=EMAIL)
    mailed = factories.notifications(tenant_b, mail, 3, status="delivered", recipient=EMAIL)
    failed = factories.notifications(tenant_b, mail, 2, status="dead_lettered", recipient=EMAIL)
    rows = [attempt(n, 1, "delivered") for n in sent]
    rows += [attempt(mailed[0], 1, "transient_error"), attempt(mailed[0], 2, "delivered")]
    rows += [attempt(n, 1, "delivered") for n in mailed[1:]]
    rows += [attempt(failed[0], 1, "transient_error"), attempt(failed[0], 2, "permanent_error")]
    rows += [attempt(failed[1], 1, "permanent_error")]
    DeliveryAttempt.objects.bulk_create(rows)
    # Latency, due → the delivered attempt's finish: 0.2 s, 3 s, 120 s; one two days ago (outside the
    # window); one scheduled (due at scheduled_for, 1 s); the other four ≈ 0 s.
    now = timezone.now()
    for n, seconds in zip(sent[:3], (0.2, 3, 120), strict=True):
        Notification.objects.filter(pk=n.pk).update(created_at=now - timedelta(seconds=seconds))
        DeliveryAttempt.objects.filter(notification=n).update(finished_at=now)
    Notification.objects.filter(pk=sent[3].pk).update(created_at=now - timedelta(days=2))
    DeliveryAttempt.objects.filter(notification=sent[3]).update(finished_at=now - timedelta(days=2))
    scheduled = factories.notifications(tenant_a, hook, 1, status="delivered", recipient=EMAIL)[0]
    Notification.objects.filter(pk=scheduled.pk).update(scheduled_for=now - timedelta(seconds=1),
                                                        created_at=now - timedelta(hours=1))
    DeliveryAttempt.objects.bulk_create([attempt(scheduled, 1, "delivered")])
    DeliveryAttempt.objects.filter(notification=scheduled).update(finished_at=now)
    for n in failed:
        DeadLetter.objects.create(tenant_id=n.tenant_id, notification=n, provider_id=n.provider_id,
                                  failure_class="permanent", failure_reason=f"410 for {EMAIL}", attempt_count=1)
    DeadLetter.objects.filter(notification=failed[1]).update(status="discarded")
    late = factories.notifications(tenant_a, hook, 1, status="scheduled")[0]
    ScheduledJob.objects.create(tenant=tenant_a, notification=late, run_at=now - timedelta(seconds=90))
    Worker.objects.create(kind="dispatcher", host="h1", pid=1)
    Worker.objects.create(kind="dispatcher", host="h2", pid=2)
    Worker.objects.create(kind="scheduler", host="h1", pid=3)
    Worker.objects.filter(pid=2).update(last_seen=now - timedelta(minutes=10))
    Worker.objects.create(kind="dispatcher", host="h3", pid=4, stopped_at=now)  # stopped: not listed
    # Lowered to 0.3/s by 429s and empty: it needs more than 3 s to hold a whole token again.
    RateBucket.objects.create(key=f"provider:{hook.pk}", rate=10, effective_rate=0.3, burst=10, tokens=0,
                              updated_at=timezone.now())
    return {"hook": hook, "mail": mail}


@pytest.mark.django_db
def test_every_figure_comes_from_the_database(populated, django_assert_max_num_queries):
    hook, mail = populated["hook"], populated["mail"]
    with django_assert_max_num_queries(12):
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

    # In the 300 s window: four ≈ 0 s, 0.2 s, 1 s (scheduled: counted from scheduled_for, not
    # created_at), 3 s and 120 s. Out: the one delivered two days ago.
    bucket = "omnipost_delivery_latency_seconds_bucket"
    assert metric_value(text, bucket, le="0.05") == 4
    assert metric_value(text, bucket, le="0.25") == 5
    assert metric_value(text, bucket, le="1") == 6
    assert metric_value(text, bucket, le="2.5") == 6
    assert metric_value(text, bucket, le="5") == 7
    assert metric_value(text, bucket, le="60") == 7
    assert metric_value(text, bucket, le="300") == metric_value(text, bucket, le="+Inf") == 8
    assert metric_value(text, "omnipost_delivery_latency_seconds_gcount") == 8
    assert metric_value(text, "omnipost_delivery_latency_seconds_gsum") == pytest.approx(124.2, abs=0.1)

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
def test_openmetrics_on_request_and_a_gauge_histogram(populated):
    response = Client().get("/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response["Content-Type"].startswith("application/openmetrics-text")
    text = response.content.decode()
    assert "# TYPE omnipost_delivery_latency_seconds gaugehistogram" in text
    assert "# TYPE omnipost_delivery_attempts counter" in text
    assert text.rstrip().endswith("# EOF")
    plain = scrape()
    assert plain.startswith("# HELP") and "# EOF" not in plain


@pytest.mark.django_db
def test_empty_database_and_no_auth():
    text = scrape()
    assert metric_value(text, "omnipost_queue_depth") == 0
    assert metric_value(text, "omnipost_dlq_open") == 0
    assert metric_value(text, "omnipost_delivery_latency_seconds_gcount") == 0
    assert Client().post("/metrics").status_code == 405
    assert "no-cache" in Client().get("/metrics")["Cache-Control"]


@pytest.mark.django_db
def test_database_down_is_503_not_a_traceback():
    with mock.patch.object(OmniPostCollector, "_queues", side_effect=OperationalError("connection refused")):
        response = Client().get("/metrics")
    assert response.status_code == 503
    assert response.content.decode().startswith("# database unavailable: OperationalError")


@pytest.mark.django_db
def test_latency_window_is_configurable(populated, settings):
    settings.OMNIPOST_METRICS_LATENCY_WINDOW_SECONDS = 3 * 86400
    text = scrape()
    assert metric_value(text, "omnipost_delivery_latency_seconds_gcount") == 9


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
    assert metric_value(text, "omnipost_delivery_latency_seconds_gcount") == delivered
    assert metric_value(text, "omnipost_dlq_open") == bad
    assert metric_value(text, "omnipost_queue_depth") == 0
    assert QueueItem.objects.count() == 0
    assert metric_value(text, "omnipost_workers", kind="dispatcher", state="live") == 0  # stopped cleanly
