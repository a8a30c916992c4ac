"""Failures end to end: the in-process dispatcher against a loopback receiver, retries on the policy's
schedule, the dead-letter queue, and redrive delivering exactly once."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import F

from dispatch.dispatcher import Dispatcher, DispatcherConfig
from dlq.models import DeadLetter
from dlq.retry import RetryPolicy
from notifications.models import DeliveryAttempt, Notification
from queueing.models import QueueItem
from tests import factories
from tests.support.fixtures import signing_secret, webhook_receiver  # noqa: F401
from tests.support.receivers import TEST_SIGNING_SECRET

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

BASE, CAP = 0.25, 0.6


@pytest.fixture(autouse=True)
def fast_retries(settings):  # noqa: ANN001, ANN201
    settings.OMNIPOST_RETRY_BASE_SECONDS = BASE
    settings.OMNIPOST_RETRY_MAX_SECONDS = CAP


@pytest.fixture
def delays(monkeypatch) -> list[tuple[int, float, float]]:  # noqa: ANN001
    """Every backoff the dispatcher chooses: (attempt, delay, jitter ceiling)."""
    chosen: list[tuple[int, float, float]] = []
    real = RetryPolicy.delay

    def spy(self: RetryPolicy, attempt: int, retry_after: float | None = None, rng=random.random) -> float:  # noqa: ANN001
        delay = real(self, attempt, retry_after, rng)
        chosen.append((attempt, delay, self.ceiling(attempt)))
        return delay

    monkeypatch.setattr(RetryPolicy, "delay", spy)
    return chosen


def run_once() -> None:
    assert Dispatcher(DispatcherConfig(once=True, jitter=False)).run() == 0


def hook(tenant, receiver, **extra):  # noqa: ANN001, ANN003, ANN201
    return factories.provider(tenant, config={"url": receiver.url}, secrets={"signing_secret": TEST_SIGNING_SECRET},
                              **extra)  # fmt: skip


def wait_until_due(item: QueueItem, extra: float = 0.02) -> None:
    time.sleep(max(0.0, (item.available_at - datetime.now(UTC)).total_seconds()) + extra)


def attempts_of(note: Notification) -> list[DeliveryAttempt]:
    return list(DeliveryAttempt.objects.filter(notification=note).order_by("number"))


def test_two_503s_then_200_delivers_on_attempt_3_on_the_policys_schedule(tenant_a, webhook_receiver, delays):  # noqa: F811
    webhook_receiver.configure(responses=[503, 503], status=200)
    (note,) = factories.queued(tenant_a, hook(tenant_a, webhook_receiver), 1)
    for number in (1, 2):
        run_once()
        note.refresh_from_db()
        assert note.status == "retrying" and note.attempt_count == number
        item = QueueItem.objects.get()
        failed = attempts_of(note)[-1]
        attempt, delay, ceiling = delays[-1]
        assert attempt == number and ceiling == min(CAP, BASE * 2 ** (number - 1))
        assert 0.0 <= delay <= ceiling  # full jitter: anywhere in [0, ceiling]
        # The item went back with available_at = (the moment the outcome was recorded) + the policy's delay.
        waited = (item.available_at - failed.finished_at).total_seconds()
        assert delay - 0.01 <= waited <= delay + 0.5
        assert item.lock_token is None and item.enqueued_at == item.available_at  # a delayed retry costs no worker
        if (item.available_at - datetime.now(UTC)).total_seconds() > 0.1:
            run_once()  # before its time nothing is sent
            assert webhook_receiver.stats()["requests"] == number
        wait_until_due(item)
    run_once()
    note.refresh_from_db()
    assert (note.status, note.attempt_count) == ("delivered", 3)
    tries = attempts_of(note)
    assert [(a.number, a.outcome, a.http_status) for a in tries] == [
        (1, "transient_error", 503), (2, "transient_error", 503), (3, "delivered", 200)]
    for before, after, (_, delay, ceiling) in zip(tries, tries[1:], delays, strict=False):
        gap = (after.started_at - before.finished_at).total_seconds()
        assert delay - 0.01 <= gap <= ceiling + 1.0  # never early; late only by our own loop
    assert [r.status for r in webhook_receiver.requests] == [503, 503, 200]
    assert {r.webhook_id for r in webhook_receiver.requests} == {str(note.pk)}
    assert all(r.verified for r in webhook_receiver.requests)
    assert not QueueItem.objects.exists() and not DeadLetter.objects.exists()


def test_503_forever_lands_in_the_dlq_after_max_attempts_with_every_attempt_recorded(tenant_a, webhook_receiver):  # noqa: F811
    webhook_receiver.configure(status=503)
    (note,) = factories.queued(tenant_a, hook(tenant_a, webhook_receiver, max_attempts=4), 1)
    deadline = time.monotonic() + 20
    while note.status != "dead_lettered" and time.monotonic() < deadline:
        run_once()
        note.refresh_from_db()
        item = QueueItem.objects.first()
        if item is not None:
            wait_until_due(item)
    assert (note.status, note.attempt_count, note.last_error_code) == ("dead_lettered", 4, "http_503")
    assert [(a.number, a.outcome, a.http_status, a.error_code) for a in attempts_of(note)] == [
        (n, "transient_error", 503, "http_503") for n in (1, 2, 3, 4)]
    entry = DeadLetter.objects.get(notification=note)
    assert (entry.status, entry.failure_class, entry.attempt_count, entry.last_status_code, entry.error_code) == (
        "open", "transient", 4, 503, "http_503")
    assert "example" not in entry.failure_reason and entry.provider_id == note.provider_id
    assert webhook_receiver.stats()["requests"] == 4
    assert not QueueItem.objects.exists()


def test_400_lands_in_the_dlq_after_one_attempt_as_failed(tenant_a, webhook_receiver):  # noqa: F811
    webhook_receiver.configure(status=400)
    (note,) = factories.queued(tenant_a, hook(tenant_a, webhook_receiver), 1)
    run_once()
    note.refresh_from_db()
    assert (note.status, note.attempt_count) == ("failed", 1)
    entry = DeadLetter.objects.get(notification=note)
    assert (entry.failure_class, entry.attempt_count, entry.last_status_code) == ("permanent", 1, 400)
    run_once()
    assert webhook_receiver.stats()["requests"] == 1 and not QueueItem.objects.exists()


def test_429_with_retry_after_is_not_retried_before_its_time(tenant_a, webhook_receiver, delays):  # noqa: F811
    webhook_receiver.configure(responses=[429], status=200, retry_after="30")
    (note,) = factories.queued(tenant_a, hook(tenant_a, webhook_receiver), 1)
    run_once()
    (first,) = attempts_of(note)
    assert (first.outcome, first.http_status) == ("transient_error", 429)
    item = QueueItem.objects.get()
    assert (item.available_at - first.finished_at).total_seconds() >= 30.0
    assert delays[-1][1] >= 30.0  # Retry-After is the earliest time, whatever the jitter drew (cap 0.6 s)
    run_once()  # within the 30 s: the dispatcher finds nothing ready and sends nothing
    assert webhook_receiver.stats()["requests"] == 1
    note.refresh_from_db()
    assert note.status == "retrying"
    # The 30 s pass for the item: its time is moved back (the queue reads the database's clock).
    QueueItem.objects.filter(pk=item.pk).update(available_at=F("available_at") - timedelta(seconds=30))
    run_once()
    note.refresh_from_db()
    second = attempts_of(note)[1]
    assert note.status == "delivered" and second.outcome == "delivered"


def test_redrive_delivers_once_and_a_delivered_notification_is_never_sent_again(
    tenant_a, webhook_receiver, api_a  # noqa: F811
):
    webhook_receiver.configure(status=503)
    (note,) = factories.queued(tenant_a, hook(tenant_a, webhook_receiver, max_attempts=2), 1)
    while note.status != "dead_lettered":
        run_once()
        note.refresh_from_db()
        item = QueueItem.objects.first()
        if item is not None:
            wait_until_due(item)
    entry = DeadLetter.objects.get(notification=note)
    webhook_receiver.configure(status=200)  # the provider recovered

    response = api_a.post(f"/api/v1/dlq/{entry.pk}/redrive")
    assert response.status_code == 202 and response.json()["notification_status"] == "queued"
    again = api_a.post(f"/api/v1/dlq/{entry.pk}/redrive")  # a double click
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_open"
    run_once()
    run_once()
    note.refresh_from_db()
    assert (note.status, note.attempt_count, note.attempt_offset) == ("delivered", 3, 2)
    assert [a.outcome for a in attempts_of(note)] == ["transient_error", "transient_error", "delivered"]
    stats = webhook_receiver.stats()
    assert stats["accepted"] == 1 and stats["duplicate_accepts"] == 0 and stats["requests"] == 3

    # A stale open entry for the delivered notification: refused, and nothing is sent.
    stale = DeadLetter.objects.create(tenant=tenant_a, notification=note, failure_class="transient",
                                      failure_reason="stale", attempt_count=2)  # fmt: skip
    refused = api_a.post(f"/api/v1/dlq/{stale.pk}/redrive")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "already_delivered"
    bulk = api_a.post("/api/v1/dlq/redrive", {}, format="json")
    assert bulk.json()["redriven"] == 0
    run_once()
    assert webhook_receiver.stats()["requests"] == 3 and not QueueItem.objects.exists()
