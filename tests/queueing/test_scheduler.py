"""The scheduler's single step (run_once), its waits, and its loop in-process."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection

from notifications.models import Notification
from queueing import queue
from queueing import scheduler as scheduling
from queueing.models import QueueItem, ScheduledJob, Worker
from queueing.scheduler import PEER_BACKOFF, Promotion, Scheduler, next_due, promote_due
from queueing.wakeup import Doorbell, _conninfo
from tests import factories
from tests.queueing.scheduler_support import bulk_scheduled_sql, scheduled, wait_until


def job_of(note: Notification) -> ScheduledJob:
    return ScheduledJob.objects.get(notification_id=note.pk)


@pytest.mark.django_db
def test_run_once_promotes_due_jobs_with_routing_and_rate_flags(tenant_a, tenant_b):
    tenant_b.rate_per_second = 10
    tenant_b.save()
    hook = factories.provider(tenant_a, "hook")
    capped = factories.provider(tenant_a, "capped", rate_per_second=5)
    b_hook = factories.provider(tenant_b, "hook")
    plain = scheduled(tenant_a, hook, seconds=-60, priority=7, queue_name="alerts")
    limited_provider = scheduled(tenant_a, capped, seconds=-30)
    limited_tenant = scheduled(tenant_b, b_hook, seconds=-1)
    later = scheduled(tenant_a, hook, seconds=3600)

    assert Scheduler(jitter=0).run_once() == 3

    items = {i.notification_id: i for i in QueueItem.objects.all()}
    assert set(items) == {plain.id, limited_provider.id, limited_tenant.id}
    first = items[plain.id]
    assert (first.queue_name, first.priority, first.payload_json) == ("alerts", 7, {"channel": "webhook"})
    assert (first.tenant_id, first.provider_id, first.attempts) == (tenant_a.pk, hook.pk, 0)
    assert first.lock_token is None and first.available_at == first.enqueued_at
    assert [items[n.id].rate_limited for n in (plain, limited_provider, limited_tenant)] == [False, True, True]
    assert items[limited_tenant.id].tenant_id == tenant_b.pk
    for note in (plain, limited_provider, limited_tenant):
        note.refresh_from_db()
        job = job_of(note)
        assert note.status == "queued" and note.enqueued_at == items[note.id].enqueued_at
        assert job.status == "executed" and job.executed_at == note.enqueued_at
    later.refresh_from_db()
    assert later.status == "scheduled" and job_of(later).status == "pending"
    assert Scheduler(jitter=0).run_once() == 0


@pytest.mark.django_db
def test_cancelled_notifications_are_never_enqueued(tenant_a):
    hook = factories.provider(tenant_a)
    # Cancelled through the API: job and notification both cancelled.
    withdrawn = scheduled(tenant_a, hook, seconds=-10, status="cancelled", job_status="cancelled")
    # Cancelled while its job was still pending (a cancel racing the scheduler).
    raced = scheduled(tenant_a, hook, seconds=-5, status="cancelled")
    live = scheduled(tenant_a, hook, seconds=-1)

    scheduler = Scheduler(jitter=0)
    assert scheduler.run_once() == 1
    assert (scheduler.last.promoted, scheduler.last.cancelled) == (1, 1)
    assert list(QueueItem.objects.values_list("notification_id", flat=True)) == [live.id]
    for note in (withdrawn, raced):
        note.refresh_from_db()
        assert note.status == "cancelled" and note.enqueued_at is None
        assert job_of(note).status == "cancelled" and job_of(note).executed_at is None
    assert scheduler.run_once() == 0 and scheduler.last.claimed == 0


@pytest.mark.django_db
@pytest.mark.parametrize("due", [10, 1000])
def test_one_batch_is_one_statement_whatever_its_size(tenant_a, due, django_assert_num_queries):
    prov = factories.provider(tenant_a)
    bulk_scheduled_sql(tenant_a, prov, due, start=-120, spread=60)
    bulk_scheduled_sql(tenant_a, prov, 5, start=600)
    scheduler = Scheduler(batch_size=1000, jitter=0)
    # one statement for the notifications' jobs, and one asking each other kind whether any is due
    with django_assert_num_queries(1 + len(scheduling._other_kinds)):
        assert scheduler.run_once() == due
    assert QueueItem.objects.count() == due
    assert ScheduledJob.objects.filter(status="executed").count() == due
    assert Notification.objects.filter(status="queued").count() == due
    assert ScheduledJob.objects.filter(status="pending").count() == 5


@pytest.mark.django_db
def test_batches_take_the_oldest_first_and_items_follow_run_at(tenant_a):
    prov = factories.provider(tenant_a)
    bulk_scheduled_sql(tenant_a, prov, 25, start=-3600, spread=3000, shuffle=True)
    scheduler = Scheduler(batch_size=10, jitter=0)
    assert [scheduler.run_once() for _ in range(4)] == [10, 10, 5, 0]
    by_item = list(QueueItem.objects.order_by("item_id").values_list("notification_id", flat=True))
    by_run_at = list(ScheduledJob.objects.order_by("run_at").values_list("notification_id", flat=True))
    assert by_item == by_run_at


@pytest.mark.django_db
def test_a_notification_already_queued_gets_no_second_item(tenant_a):
    hook = factories.provider(tenant_a)
    note = scheduled(tenant_a, hook, seconds=-1)
    queue.enqueue([queue.NewItem(notification_id=note.id, tenant_id=tenant_a.pk, provider_id=hook.pk)])
    assert promote_due(10).promoted == 1
    assert QueueItem.objects.filter(notification_id=note.pk).count() == 1


@pytest.mark.django_db
def test_a_job_whose_notification_is_gone_ends_cancelled(tenant_a):
    """No foreign key keeps a job with its notification: one deleted without its job is settled, not
    left due (the scheduler would wake for it every PEER_BACKOFF for ever)."""
    hook = factories.provider(tenant_a)
    orphan = scheduled(tenant_a, hook, seconds=-2)
    live = scheduled(tenant_a, hook, seconds=-1)
    Notification.objects.filter(pk=orphan.pk).delete()
    last = promote_due(10)
    assert (last.promoted, last.cancelled) == (1, 1)
    assert job_of(orphan).status == "cancelled" and job_of(orphan).executed_at is None
    assert list(QueueItem.objects.values_list("notification_id", flat=True)) == [live.id]
    assert next_due() == (None, None)


@pytest.mark.django_db(transaction=True)
def test_a_notification_someone_holds_waits_for_the_next_batch(tenant_a):
    hook = factories.provider(tenant_a)
    held = scheduled(tenant_a, hook, seconds=-2)
    free = scheduled(tenant_a, hook, seconds=-1)
    with psycopg.connect(**_conninfo("default", "omnipost-test-cancel")) as cancel, cancel.transaction():
        cancel.execute("SELECT 1 FROM notifications WHERE id = %s FOR UPDATE", [held.id])  # a cancel in flight
        last = promote_due(10)
        assert (last.promoted, last.cancelled) == (1, 0)
        assert job_of(held).status == "pending" and job_of(free).status == "executed"
    assert promote_due(10).promoted == 1
    assert job_of(held).status == "executed"


@pytest.fixture
def no_handler():
    saved = list(scheduling._handler)
    scheduling._handler.clear()
    yield
    scheduling._handler[:] = saved


@pytest.mark.django_db
def test_the_scheduler_hands_due_jobs_to_the_registered_handler(tenant_a, no_handler):
    seen = []

    def handler(batch_size: int, using: str) -> Promotion:
        seen.append((batch_size, using))
        return Promotion(2, 1, ("a",), 0.5)

    scheduling.register_promotion(handler)
    worker = Scheduler(batch_size=7, jitter=0)
    assert worker.run_once() == 2
    assert worker.last == Promotion(2, 1, ("a",), 0.5) and seen == [(7, "default")]


@pytest.mark.django_db
def test_without_a_handler_the_scheduler_fails_loudly(tenant_a, no_handler):
    note = scheduled(tenant_a, factories.provider(tenant_a), seconds=-1)
    with pytest.raises(ImproperlyConfigured, match="register_promotion"):
        promote_due(10)
    with pytest.raises(ImproperlyConfigured, match="register_promotion"):
        Scheduler(jitter=0).run(once=True)
    assert job_of(note).status == "pending"  # nothing settled unseen
    assert not Worker.objects.exists()  # it refused before it started


@pytest.mark.django_db
def test_next_due_uses_the_database_clock(tenant_a):
    assert next_due() == (None, None)
    hook = factories.provider(tenant_a)
    later = scheduled(tenant_a, hook, seconds=30)
    run_at, wait = next_due()
    assert run_at == job_of(later).run_at and wait == pytest.approx(30, abs=0.001)
    scheduled(tenant_a, hook, seconds=-2)
    assert next_due()[1] == pytest.approx(-2, abs=0.001)


def test_doorbell_wakes_only_for_a_job_due_before_the_current_target():
    scheduler = Scheduler(jitter=0)
    target = datetime(2030, 1, 1, 12, tzinfo=UTC)
    scheduler._target = target
    scheduler._on_schedule_ring((target + timedelta(seconds=5)).isoformat())
    assert not scheduler._wake.is_set()
    scheduler._on_schedule_ring((target - timedelta(milliseconds=1)).isoformat())
    assert scheduler._wake.is_set()
    for payload in ("not a date", "2030-01-01T13:00:00"):  # unparseable or naive: wake and re-read
        scheduler._wake.clear()
        scheduler._on_schedule_ring(payload)
        assert scheduler._wake.is_set()
    scheduler._wake.clear()
    scheduler._target = None  # reading the table right now: any ring counts
    scheduler._on_schedule_ring((target + timedelta(days=1)).isoformat())
    assert scheduler._wake.is_set()


def test_sleeps_are_capped_by_interval_and_heartbeat():
    scheduler = Scheduler(interval=5, jitter=0, heartbeat_interval=3)
    scheduler._next_beat = time.monotonic() + 1000
    assert scheduler._timeout(None, 0) == 5  # nothing pending: poll fallback
    assert scheduler._timeout(3600, 0) == 5
    assert scheduler._timeout(0.25, 0) == 0.25
    assert scheduler._timeout(-0.1, 3) == 0  # more became due while promoting
    assert scheduler._timeout(-0.1, 0) == PEER_BACKOFF  # due but held by a peer
    scheduler._next_beat = time.monotonic() + 1
    assert 0.9 < scheduler._timeout(3600, 0) <= 1


@pytest.mark.django_db(transaction=True)
def test_a_promotion_rings_the_dispatchers_doorbell_at_commit(tenant_a):
    hook = factories.provider(tenant_a)
    rings: list[str] = []
    rang = threading.Event()
    bell = Doorbell(lambda payload: (rings.append(payload), rang.set()), channel=queue.NOTIFY_CHANNEL).start()
    try:
        assert bell.connected.wait(10)
        scheduled(tenant_a, hook, seconds=-1, queue_name="b")
        scheduled(tenant_a, hook, seconds=-1, queue_name="a")
        assert promote_due(10).queues == ("a", "b")
        assert rang.wait(5)
        assert rings == ["a,b"]
        rang.clear()
        assert promote_due(10).promoted == 0
        assert not rang.wait(0.3)  # an empty batch rings no one
    finally:
        bell.stop()


@pytest.mark.django_db(transaction=True)
def test_run_loop_fires_on_time_registers_and_stops(tenant_a):
    hook = factories.provider(tenant_a)
    scheduler = Scheduler(interval=30, jitter=0, heartbeat_interval=0.3)
    thread = threading.Thread(target=scheduler.run)
    thread.start()
    try:
        wait_until(lambda: Worker.objects.filter(kind="scheduler", stopped_at__isnull=True).exists(), 10,
                   "the scheduler to register")
        note = scheduled(tenant_a, hook, seconds=0.5)
        wait_until(lambda: QueueItem.objects.filter(notification_id=note.pk).exists(), 10, "the job to fire")
    finally:
        scheduler.stop()
        thread.join(10)
    assert not thread.is_alive()
    item = QueueItem.objects.get(notification_id=note.pk)
    lag = (item.enqueued_at - job_of(note).run_at).total_seconds()
    assert 0 <= lag < 1.0
    worker = Worker.objects.get(kind="scheduler")
    assert worker.stopped_at is not None and worker.processed == 1


@pytest.mark.django_db(transaction=True)
def test_once_command_drains_everything_due_and_exits(tenant_a):
    prov = factories.provider(tenant_a)
    bulk_scheduled_sql(tenant_a, prov, 20, start=-100, spread=90)
    bulk_scheduled_sql(tenant_a, prov, 2, start=3600)
    call_command("run_scheduler", "--once", "--no-jitter", "--batch-size", "7")
    assert QueueItem.objects.count() == 20
    assert ScheduledJob.objects.filter(status="pending").count() == 2
    worker = Worker.objects.get(kind="scheduler")
    assert worker.stopped_at is not None and worker.processed == 20
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('application_name')")
        assert not cursor.fetchone()[0].startswith("omnipost-scheduler")


@pytest.mark.parametrize("args", [["--interval", "0"], ["--batch-size", "0"]])
def test_command_rejects_nonsense(args):
    with pytest.raises(CommandError, match="must be a positive"):
        call_command("run_scheduler", "--once", *args)
