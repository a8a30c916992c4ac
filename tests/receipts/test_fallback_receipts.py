"""Receipts and channel fallback (notifications.fallback), in the receipts statement: a `bounced`,
`undelivered` or `failed` receipt makes the pending fallback due at once (even before the dispatcher
recorded the acceptance); a `delivered` (or `complained`) one cancels it and its job (or, once
promoted, its queue item unless a dispatcher holds it), and a later
bounce never brings it back; the fallback's own receipts change nothing else. And the dispatcher's
side (`record_ctes`, in a statement of its own here): an acceptance makes the fallback due
`after_seconds` later, a failure at once, a suppression cancels it."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifications import fallback
from notifications.models import Notification, Status
from queueing.models import ScheduledJob
from receipts import providers as provider_views
from receipts.models import NotificationEvent, ReceiptCounter, ReceiptDedup
from receipts.services import apply_receipts
from tests.receipts.conftest import receipt
from tests.support.setups import PHONE, TOKEN, make_setup

pytestmark = pytest.mark.django_db


@pytest.fixture
def created(tenant_a, api_a):  # noqa: ANN001, ANN201
    setup = make_setup(tenant_a)
    subscriber = {"phone": PHONE, "push_tokens": [TOKEN]}
    assert api_a.put("/api/v1/subscribers/u", subscriber, format="json").status_code == 201

    def create(after: int = 600) -> tuple[Notification, Notification]:
        steps = [{"channel": "sms", "after_seconds": after}]
        body = {"channel": "push", "subscriber": "u", "body": "b", "fallback": steps}
        data = api_a.post("/api/v1/notifications", body, format="json").json()
        return Notification.objects.get(pk=data["id"]), Notification.objects.get(pk=data["fallback_notification_id"])

    create.view = provider_views.load(setup.push.pk)
    create.sms_view = provider_views.load(setup.text.pk)  # the fallbacks' provider: their receipts come from it
    return create


def db_now():  # noqa: ANN201
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("kind", ["bounced", "undelivered", "failed"])
def test_a_bad_receipt_makes_the_fallback_due_at_once(created, kind):
    original, linked = created()
    result = apply_receipts(created.view, [receipt(original, kind, bounce_type="soft" if kind == "bounced" else None)])
    assert [row.receipt for row in result.changed] == [kind]
    job = ScheduledJob.objects.get(notification_id=linked.pk)
    assert job.status == "pending" and job.run_at == db_now()  # the statement's clock (one transaction here)
    linked.refresh_from_db()
    assert linked.status == "scheduled" and linked.scheduled_for == job.run_at
    # a delivered receipt after it ranks lower (changes nothing): the fallback stays due
    apply_receipts(created.view, [receipt(original, "delivered")])
    assert ScheduledJob.objects.get(notification_id=linked.pk).status == "pending"
    assert Notification.objects.get(pk=linked.pk).status == "scheduled"


def test_a_batch_naming_a_notification_with_a_fallback_is_applied_once_by_the_statement_that_follows_it(created):
    """Receipts of notifications without a fallback take the statement without the fallback's CTEs;
    one with a fallback in the batch makes that statement store nothing and the full one apply all
    (receipts for what another provider sent are ignored by both)."""
    original, linked = created()
    _, plain = created()  # a fallback has no fallback of its own
    with CaptureQueriesContext(connection) as ctx:
        result = apply_receipts(created.sms_view, [receipt(plain, "delivered")])
    assert len(ctx.captured_queries) == 1 and "scheduled_jobs" not in ctx.captured_queries[0]["sql"]
    assert result.applied == 1

    batch = [receipt(original, "undelivered"), receipt(linked, "delivered"), receipt("unknown", "delivered")]
    with CaptureQueriesContext(connection) as ctx:
        result = apply_receipts(created.view, batch)
    applies = [q["sql"] for q in ctx.captured_queries if "receipt_dedup" in q["sql"]]  # then the follow-ups'
    assert len(applies) == 2 and "scheduled_jobs" not in applies[0] and "scheduled_jobs" in applies[1]
    # `linked` went out through the SMS provider: the push provider's word on it is ignored.
    assert (result.applied, result.duplicate, result.ignored) == (1, 0, 2)
    assert {row.notification_id for row in result.changed} == {original.pk}
    assert NotificationEvent.objects.filter(notification_id__in=[original.pk, linked.pk]).count() == 1
    assert ReceiptDedup.objects.count() == 2  # the plain one's and the original's, once each
    assert sorted(ReceiptCounter.objects.values_list("reason", "count")) == [("other_provider", 1), ("unknown", 1)]
    assert ScheduledJob.objects.get(notification_id=linked.pk).status == "pending"  # made due by `undelivered`


@pytest.mark.parametrize("kind", ["delivered", "complained"])
def test_a_delivered_receipt_cancels_the_fallback_for_good(created, kind):
    original, linked = created()
    # as if the acceptance had been recorded: a job due in 10 minutes
    ScheduledJob.objects.create(tenant_id=linked.tenant_id, notification_id=linked.pk,
                                run_at=timezone.now() + timedelta(minutes=10))  # fmt: skip
    apply_receipts(created.view, [receipt(original, kind)])
    assert Notification.objects.get(pk=linked.pk).status == "cancelled"
    assert ScheduledJob.objects.get(notification_id=linked.pk).status == "cancelled"
    apply_receipts(created.view, [receipt(original, "bounced", bounce_type="hard")])
    assert Notification.objects.get(pk=linked.pk).status == "cancelled"
    assert ScheduledJob.objects.get(notification_id=linked.pk).status == "cancelled"


def test_a_receipt_never_moves_a_job_later_nor_one_already_run(created):
    original, linked = created()
    early = timezone.now() - timedelta(seconds=30)
    ScheduledJob.objects.create(tenant_id=linked.tenant_id, notification_id=linked.pk, run_at=early)
    apply_receipts(created.view, [receipt(original, "undelivered")])
    assert ScheduledJob.objects.get(notification_id=linked.pk).run_at == early
    other, promoted = created()
    ScheduledJob.objects.create(tenant_id=promoted.tenant_id, notification_id=promoted.pk, run_at=early,
                                status="executed")  # fmt: skip
    Notification.objects.filter(pk=promoted.pk).update(status=Status.QUEUED)  # (with no queue item)
    apply_receipts(created.view, [receipt(other, "delivered")])
    assert Notification.objects.get(pk=promoted.pk).status == "queued"
    assert ScheduledJob.objects.get(notification_id=promoted.pk).status == "executed"


def test_a_late_delivered_receipt_cancels_a_promoted_fallback_no_dispatcher_holds(created):
    from queueing.models import QueueItem
    from queueing.scheduler import promote_due

    def promoted() -> tuple[Notification, Notification]:
        original, linked = created()
        ScheduledJob.objects.create(tenant_id=linked.tenant_id, notification_id=linked.pk,
                                    run_at=timezone.now() - timedelta(minutes=1))  # fmt: skip
        promote_due(100)
        assert Notification.objects.get(pk=linked.pk).status == "queued"
        assert QueueItem.objects.filter(notification_id=linked.pk).exists()
        return original, linked

    def delivered(original: Notification) -> None:
        apply_receipts(created.view, [receipt(original, "delivered")])

    original, idle = promoted()
    delivered(original)
    assert Notification.objects.get(pk=idle.pk).status == "cancelled"
    assert not QueueItem.objects.filter(notification_id=idle.pk).exists()

    original, held = promoted()  # leased: a dispatcher is sending it, too late to call back
    QueueItem.objects.filter(notification_id=held.pk).update(lock_token=uuid.uuid4(),
                                                             locked_until=timezone.now() + timedelta(minutes=1))
    delivered(original)
    assert Notification.objects.get(pk=held.pk).status == "queued"
    assert QueueItem.objects.filter(notification_id=held.pk).exists()


def record(outcomes: list[tuple[Notification, str]]) -> int:
    """`record_ctes` after a `changed` of these (notification, outcome) pairs, as the dispatcher's
    record statement runs it; returns how many fallback jobs rang the schedulers."""
    sql = (f"WITH changed AS (SELECT n.tenant_id, o.status, {fallback.RETURNING} FROM notifications n "  # noqa: S608
           f"JOIN unnest(%s::uuid[], %s::text[]) AS o(id, status) ON o.id = n.id), "
           f"{fallback.record_ctes('changed')} SELECT count(*) FROM fb_ring")  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(sql, [[n.pk for n, _ in outcomes], [kind for _, kind in outcomes]])
        return cursor.fetchone()[0]


def test_the_record_statement_makes_fallbacks_due_or_cancels_them(created):
    accepted, accepted_fb = created(after=120)
    refused, refused_fb = created()
    exhausted, exhausted_fb = created()
    suppressed, suppressed_fb = created()
    assert record([(accepted, "delivered"), (refused, "failed"), (exhausted, "dead_lettered"),
                   (suppressed, "suppressed")]) == 1  # fmt: skip
    now = db_now()  # the statement's clock (one transaction here)
    jobs = {j.notification_id: j for j in ScheduledJob.objects.all()}
    assert jobs[accepted_fb.pk].run_at == now + timedelta(seconds=120)
    assert jobs[refused_fb.pk].run_at == jobs[exhausted_fb.pk].run_at == now
    assert Notification.objects.get(pk=accepted_fb.pk).scheduled_for == jobs[accepted_fb.pk].run_at
    assert Notification.objects.get(pk=suppressed_fb.pk).status == "cancelled" and suppressed_fb.pk not in jobs
    assert {j.status for j in jobs.values()} == {"pending"}

    # a bad receipt then moves the accepted one's job up to now; a delivered one cancels for good
    confirmed, confirmed_fb = created()
    record([(confirmed, "delivered")])
    apply_receipts(created.view, [receipt(confirmed, "delivered"), receipt(accepted, "bounced", bounce_type="soft")])
    assert Notification.objects.get(pk=confirmed_fb.pk).status == "cancelled"
    assert ScheduledJob.objects.get(notification_id=confirmed_fb.pk).status == "cancelled"
    assert ScheduledJob.objects.get(notification_id=accepted_fb.pk).run_at == now
    # recorded again (a later outcome of the same row): a pending job keeps its earliest time
    record([(accepted, "delivered")])
    assert ScheduledJob.objects.get(notification_id=accepted_fb.pk).run_at == now
