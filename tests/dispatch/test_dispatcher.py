"""The dispatcher in-process against real loopback receivers: outcomes, statuses, attempts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from dispatch.dispatcher import Dispatcher, DispatcherConfig
from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt, Notification
from queueing.models import QueueItem, Worker
from tests import factories
from tests.support.receivers import TEST_SIGNING_SECRET

pytestmark = pytest.mark.django_db(transaction=True)


def run_once(**overrides) -> Dispatcher:
    dispatcher = Dispatcher(DispatcherConfig(once=True, jitter=False, **overrides))
    assert dispatcher.run() == 0
    return dispatcher


def hook_for(tenant, receiver, **extra):
    return factories.provider(tenant, config={"url": receiver.url}, secrets={"signing_secret": TEST_SIGNING_SECRET},
                              **extra)


def test_delivers_signed_webhooks_and_records_attempts(tenant_a, webhook_receiver):
    notes = factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 25)
    run_once(concurrency=10, batch_size=7)
    assert webhook_receiver.wait_for(25)
    received = webhook_receiver.requests
    assert all(r.verified for r in received)
    assert sorted(r.webhook_id for r in received) == sorted(str(n.id) for n in notes)
    assert set(Notification.objects.values_list("status", flat=True)) == {"delivered"}
    assert DeliveryAttempt.objects.filter(outcome="delivered", number=1).count() == 25
    assert QueueItem.objects.count() == 0
    worker = Worker.objects.get()
    assert worker.stopped_at is not None and worker.kind == "dispatcher"


def test_permanent_failure_goes_to_dlq_after_one_attempt(tenant_a, webhook_receiver):
    webhook_receiver.configure(status=400)
    (note,) = factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 1)
    run_once()
    note.refresh_from_db()
    assert note.status == "failed" and note.attempt_count == 1 and note.last_error_code == "http_400"
    entry = DeadLetter.objects.get(notification=note)
    assert (entry.failure_class, entry.status, entry.last_status_code, entry.attempt_count) == (
        "permanent", "open", 400, 1)
    assert QueueItem.objects.count() == 0


def test_transient_failure_is_released_for_retry(tenant_a, webhook_receiver, settings):
    settings.OMNIPOST_RETRY_BASE_SECONDS = 30
    webhook_receiver.configure(status=503)
    (note,) = factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 1)
    run_once()
    note.refresh_from_db()
    assert note.status == "retrying" and note.attempt_count == 1
    item = QueueItem.objects.get()
    assert item.lock_token is None and item.attempts == 1
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.outcome, attempt.http_status, attempt.error_code) == ("transient_error", 503, "http_503")


def test_cancelled_notification_is_never_sent(tenant_a, webhook_receiver):
    notes = factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 3)
    Notification.objects.filter(pk=notes[0].pk).update(status="cancelled")
    Notification.objects.filter(pk=notes[1].pk).update(status="delivered")
    run_once()
    assert webhook_receiver.wait_for(1)
    assert [r.webhook_id for r in webhook_receiver.requests] == [str(notes[2].id)]
    assert QueueItem.objects.count() == 0
    assert Notification.objects.get(pk=notes[0].pk).status == "cancelled"


def test_max_items_stops_early(tenant_a, webhook_receiver):
    factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 10)
    run_once(max_items=4, batch_size=3)
    assert Notification.objects.filter(status="delivered").count() == 4
    assert QueueItem.objects.count() == 6


def test_ssrf_guard_refuses_private_destination_at_send_time(tenant_a, webhook_receiver, settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    (note,) = factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 1)
    run_once()
    note.refresh_from_db()
    assert note.status == "failed" and note.last_error_code == "destination_forbidden"
    assert webhook_receiver.requests == []
    assert DeadLetter.objects.get(notification=note).failure_class == "permanent"


def test_misconfigured_provider_fails_its_items_and_spares_the_rest(tenant_a, webhook_receiver):
    good = hook_for(tenant_a, webhook_receiver)
    broken = factories.provider(tenant_a, "broken", config={"url": webhook_receiver.url}, secrets={})
    ok_notes = factories.queued(tenant_a, good, 3)
    (bad_note,) = factories.queued(tenant_a, broken, 1)
    run_once()
    bad_note.refresh_from_db()
    assert bad_note.status == "failed" and bad_note.last_error_code == "invalid_config"
    assert Notification.objects.filter(pk__in=[n.pk for n in ok_notes], status="delivered").count() == 3


def test_recipients_under_an_older_key_are_sent_and_unreadable_ones_never_leave(tenant_a, webhook_receiver, settings):
    from cryptography.fernet import Fernet

    hook = hook_for(tenant_a, webhook_receiver)
    fresh = factories.queued(tenant_a, hook, 3)
    (older,) = factories.queued(tenant_a, hook, 1)
    (unreadable,) = factories.queued(tenant_a, hook, 1)
    old_key = Fernet.generate_key().decode()
    settings.OMNIPOST_ENCRYPTION_KEYS = [*settings.OMNIPOST_ENCRYPTION_KEYS, old_key]
    from django.db import connection

    with connection.cursor() as cursor:  # written under a key still configured but not the newest
        token = Fernet(old_key.encode()).encrypt(b"https://example.test/older").decode()
        cursor.execute("UPDATE notifications SET recipient = %s WHERE id = %s", [token, older.pk])
        stray = Fernet(Fernet.generate_key()).encrypt(b"https://example.test/unreadable").decode()
        cursor.execute("UPDATE notifications SET recipient = %s WHERE id = %s", [stray, unreadable.pk])
    run_once()
    assert webhook_receiver.wait_for(4)
    recipients = {r.payload["id"]: r.payload["recipient"] for r in webhook_receiver.requests}
    assert recipients[str(older.pk)] == "https://example.test/older"
    assert all(recipients[str(n.pk)] == "https://example.test/hook" for n in fresh)
    assert str(unreadable.pk) not in recipients
    attempt = DeliveryAttempt.objects.get(notification=unreadable)
    assert attempt.outcome != "delivered" and "cannot decrypt" in attempt.error_message


def test_a_recording_bug_stops_the_dispatcher_instead_of_sending_on(tenant_a, webhook_receiver, monkeypatch):
    factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 30)

    def broken(batch, **kwargs):
        raise TypeError("a bug in recording")

    monkeypatch.setattr("dispatch.recording.record_outcomes", broken)
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, batch_size=5, concurrency=5))
    assert dispatcher.run() == 1
    assert len(webhook_receiver.requests) < 30  # it stopped claiming after the first failed batch


def test_claims_look_for_starving_items_once_a_second(tenant_a, webhook_receiver, settings):
    settings.OMNIPOST_STARVATION_SECONDS = 5
    hook = hook_for(tenant_a, webhook_receiver)
    starving = {n.id for n in factories.queued(tenant_a, hook, 3, priority=0)}
    QueueItem.objects.update(enqueued_at=Now() - timedelta(seconds=10), available_at=Now() - timedelta(seconds=10))
    fresh = {n.id for n in factories.queued(tenant_a, hook, 10, priority=9)}
    now = [1000.0]
    dispatcher = Dispatcher(DispatcherConfig(jitter=False), clock=lambda: now[0])

    def claim(n: int) -> set:
        prepared = dispatcher.claimer.claim(n).send
        return {p.notification_id for p in prepared}

    assert claim(2) <= starving  # the first claim looks: the starving items outrank priority 9
    now[0] += 0.5
    assert claim(2) <= fresh  # within the second: priority order only
    now[0] += 0.6
    assert len(claim(2) & starving) == 1  # a second on: the last starving item


def test_an_idle_dispatcher_is_woken_by_an_enqueue(tenant_a, webhook_receiver, monkeypatch):
    """A ring reaches an idle dispatcher (claimed on the LISTEN connection, tests/dispatch/
    test_doorbell_claims.py). The idle poll is made a minute long, so a delivery within seconds was rung."""
    import os
    import socket
    import threading
    import time

    from django.db import connection

    from dispatch import dispatcher as dispatcher_module

    monkeypatch.setattr(dispatcher_module, "MIN_POLL", 60.0)
    monkeypatch.setattr(dispatcher_module, "MAX_POLL", 60.0)
    hook = hook_for(tenant_a, webhook_receiver)
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=10, batch_size=10))
    result: dict = {}

    def run() -> None:
        result["code"] = dispatcher.run()

    def listening() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN%%'",
                [f"omnipost-dispatcher-listen-{socket.gethostname()}-{os.getpid()}"],
            )
            return cursor.fetchone()[0] == 1

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert wait_for(listening, 10)
        time.sleep(0.3)  # the fetch loop's first claim found nothing: asleep for a minute
        for n in range(1, 4):
            factories.queued(tenant_a, hook, 1)  # enqueue commits and rings
            assert wait_for(lambda n=n: len(webhook_receiver.requests) == n, 5)
            time.sleep(0.3)  # asleep again
    finally:
        dispatcher.loop.call_soon_threadsafe(dispatcher._on_signal, 15)
        thread.join(20)
    assert result["code"] == 0
    assert Notification.objects.filter(status="delivered").count() == 3


def wait_for(predicate, timeout: float) -> bool:  # noqa: ANN001
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def test_a_delivered_outcome_records_what_the_classifier_would():
    """The delivered fast path in Sender.outcome builds the same attempt as classification."""
    import uuid
    from datetime import UTC, datetime

    from dispatch.delivery import DispatchLease, Prepared
    from dispatch.providers import ProviderCache
    from dispatch.sending import Sender
    from dlq.classifier import classify
    from dlq.retry import RetryPolicy
    from providers.kinds.base import DeliveryResult

    lease = DispatchLease(7, uuid.uuid4(), 3, False, str(uuid.uuid4()), str(uuid.uuid4()))
    item = Prepared(lease, "webhook", "token", "s", "b", {}, datetime.now(UTC), 4, 2)
    sender = Sender(ProviderCache(), recorder=None, retry=RetryPolicy(1, 1))  # the outcome reads its arguments
    started = datetime.now(UTC)
    result = DeliveryResult(delivered=True, http_status=201, message="accepted " * 100, error_class="")
    outcome = sender.outcome(item, result, started, 0.0425)
    verdict = classify(result)
    assert (outcome.lease, outcome.kind, outcome.retry_delay, outcome.error_code) == (lease, "delivered", 0.0, "")
    a = outcome.attempt
    assert (a.number, a.started_at, a.outcome, a.error_code, a.http_status, a.duration_ms) == (
        4, started, verdict.outcome, verdict.error_code, 201, 42,
    )
    assert a.error_message == result.message[:500] and a.error_class == ""
    assert started <= a.finished_at <= datetime.now(UTC)


def test_a_dispatcher_works_while_its_claims_find_something_and_its_janitor_is_told(tenant_a, webhook_receiver):
    """`_working`, what the dispatcher's janitor holds back on (queueing.janitor): true once a claim found
    work, false before any and WORKING_SECONDS after the last."""
    from dispatch import dispatcher as module

    idle = run_once()
    assert not idle._working()  # nothing claimed
    factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 3)
    busy = run_once()
    assert webhook_receiver.wait_for(3) and busy._working()
    busy._found_at -= module.WORKING_SECONDS
    assert not busy._working()
