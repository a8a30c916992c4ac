"""The sequence service, and the proof for issue 6: a 3-step sequence enrolled and then removed
after step 1 delivers exactly one notification (real scheduler and dispatcher, loopback receiver)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core.models import Tenant
from dispatch.delivery import claim_and_start
from dispatch.dispatcher import Dispatcher, DispatcherConfig
from notifications.models import DeliveryAttempt, Notification
from queueing.models import QueueItem, ScheduledJob
from queueing.scheduler import Scheduler
from templating.models import Template
from tests import factories
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver
from tests.support.setups import EMAIL
from workflows import sequences
from workflows.models import WorkflowRun
from workflows.sequences import StepSpec

ACTOR = "test:sequences"


def email_sequence(tenant: Tenant, key: str = "drip", offsets: tuple[int, ...] = (0, 3600, 7200)) -> None:
    for i in range(len(offsets)):
        Template.objects.create(tenant=tenant, key=f"{key}{i}", channel="email", body=f"step {i} for {{{{ name }}}}")
    steps = [StepSpec(offset, "email", f"{key}{i}") for i, offset in enumerate(offsets)]
    sequences.create_sequence(tenant, key, "", steps, actor=ACTOR)


def step_notes(enrollment_id: object) -> list[Notification]:
    """An enrollment's notifications, in step order (the run's steps name them)."""
    ids = [s["notification_id"] for s in WorkflowRun.objects.get(pk=enrollment_id).steps if s["notification_id"]]
    return sorted(Notification.objects.filter(pk__in=ids), key=sequences.step_position)


# --- the service ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enroll_statements_are_the_same_for_2_and_20_steps(setup_a):
    email_sequence(setup_a.tenant, "two", tuple(range(0, 120, 60)))
    email_sequence(setup_a.tenant, "twenty", tuple(range(0, 1200, 60)))
    counts = []
    for key in ("two", "twenty"):
        with connection.execute_wrapper(lambda execute, *args, key=key: counts.append(key) or execute(*args)):
            sequences.enroll(setup_a.tenant, key, recipient=EMAIL, context={"name": "J"}, actor=ACTOR)
    assert 0 < counts.count("two") == counts.count("twenty") <= 12, counts
    assert Notification.objects.count() == 22 and ScheduledJob.objects.count() == 20


@pytest.mark.django_db
def test_unenroll_cancels_what_waits_and_lets_a_dispatching_step_finish(setup_a):
    email_sequence(setup_a.tenant, offsets=(0, 60, 120, 7200))
    started = timezone.now() - timedelta(seconds=300)  # steps 0-2 are due, step 3 is not
    enrollment = sequences.enroll(setup_a.tenant, "drip", recipient=EMAIL, context={}, starts_at=started, actor=ACTOR)
    first, second, third, fourth = step_notes(enrollment.pk)
    assert [n.status for n in (first, second, third, fourth)] == ["queued", "queued", "queued", "scheduled"]
    # Step 0 is being delivered right now: leased, and dispatching.
    QueueItem.objects.exclude(notification_id=first.pk).update(available_at=timezone.now() + timedelta(hours=1))
    prepared, skipped = claim_and_start(1)
    assert [p.notification_id for p in prepared] == [first.pk] and not skipped
    # Step 1 waits for a retry (idle item in the future); step 2 is queued; step 3 scheduled.
    Notification.objects.filter(pk=second.pk).update(status="retrying")

    result = sequences.unenroll(setup_a.tenant, "drip", enrollment.pk, actor=ACTOR)
    assert result == sequences.Unenrolled(steps_cancelled=3, jobs_cancelled=1)
    live = {n.pk: n.live_status for n in Notification.objects.with_live_status()}
    statuses = [live[n.pk] for n in (first, second, third, fourth)]
    assert statuses == ["dispatching", "cancelled", "cancelled", "cancelled"]
    assert Notification.objects.get(pk=first.pk).status == "queued"  # the lease is the dispatch, not a write
    assert list(QueueItem.objects.values_list("notification_id", flat=True)) == [first.pk]  # the lease stays
    assert ScheduledJob.objects.get(notification_id=fourth.pk).status == "cancelled"
    row = WorkflowRun.objects.get(pk=enrollment.pk)
    assert row.status == "cancelled" and row.workflow.kind == "sequence"


@pytest.mark.django_db
def test_a_step_cancelled_on_its_own_is_not_counted_again(setup_a):
    from notifications.services import cancel_notification

    email_sequence(setup_a.tenant)
    enrollment = sequences.enroll(setup_a.tenant, "drip", recipient=EMAIL, context={}, actor=ACTOR)
    cancel_notification(setup_a.tenant, step_notes(enrollment.pk)[1].pk, actor=ACTOR)
    result = sequences.unenroll(setup_a.tenant, "drip", enrollment.pk, actor=ACTOR)
    assert result == sequences.Unenrolled(steps_cancelled=2, jobs_cancelled=1)
    assert {n.status for n in step_notes(enrollment.pk)} == {"cancelled"}


@pytest.mark.django_db
def test_the_scheduler_skips_a_removed_enrollments_steps(setup_a):
    email_sequence(setup_a.tenant)
    enrollment = sequences.enroll(setup_a.tenant, "drip", recipient=EMAIL, context={}, actor=ACTOR)
    sequences.unenroll(setup_a.tenant, "drip", enrollment.pk, actor=ACTOR)
    ScheduledJob.objects.update(run_at=timezone.now() - timedelta(seconds=1))
    scheduler = Scheduler(jitter=0)
    assert scheduler.run_once() == 0 and scheduler.last.claimed == 0
    assert not QueueItem.objects.exists()


# --- the proof ------------------------------------------------------------------------------------


def run_dispatcher() -> None:
    assert Dispatcher(DispatcherConfig(once=True, jitter=False)).run() == 0


@pytest.mark.django_db(transaction=True)
def test_a_3_step_sequence_removed_after_step_1_delivers_exactly_one(api_a, tenant_a, webhook_receiver: HttpReceiver):
    factories.provider(tenant_a, "hook", config={"url": webhook_receiver.url},
                       secrets={"signing_secret": TEST_SIGNING_SECRET}, is_default=True)  # fmt: skip
    for i in range(3):
        Template.objects.create(tenant=tenant_a, key=f"step{i}", channel="webhook", subject=f"Step {i}",
                                body=f"Hello {{{{ name }}}}, this is step {i}")  # fmt: skip
    steps = [{"offset_seconds": offset, "channel": "webhook", "template": f"step{i}"}
             for i, offset in enumerate((0, 3600, 7200))]  # fmt: skip
    assert api_a.post("/api/v1/sequences", {"key": "drip", "steps": steps}, format="json").status_code == 201
    url = "/api/v1/sequences/drip/enrollments"
    # `removed` is the subject of the proof; `kept` shows the same jobs would really have fired.
    removed = api_a.post(url, {"recipient": "user-removed", "context": {"name": "Rem"}}, format="json").json()
    kept = api_a.post(url, {"recipient": "user-kept", "context": {"name": "Kep"}}, format="json").json()
    removed_ids = [s["notification_id"] for s in removed["steps"]]
    kept_ids = [s["notification_id"] for s in kept["steps"]]

    # Step 1 (offset 0) was queued at enrollment: the dispatcher delivers it.
    assert Scheduler(jitter=0).run_once() == 0
    run_dispatcher()
    assert webhook_receiver.wait_for(2)
    assert Notification.objects.get(pk=removed_ids[0]).status == "delivered"

    assert api_a.delete(f"{url}/{removed['id']}").status_code == 204

    # Make every remaining step due now, then run the scheduler and the dispatcher again.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE scheduled_jobs SET run_at = now() - interval '1 second'")
    scheduler = Scheduler(jitter=0)
    assert scheduler.run_once() == 2  # kept's steps 2 and 3 only
    run_dispatcher()
    assert webhook_receiver.wait_for(4)
    assert scheduler.run_once() == 0
    run_dispatcher()

    received = webhook_receiver.requests
    assert len(received) == 4 and all(r.verified for r in received)
    to_removed = [r for r in received if r.payload["recipient"] == "user-removed"]
    assert len(to_removed) == 1
    assert to_removed[0].webhook_id == removed_ids[0]
    assert to_removed[0].payload["body"] == "Hello Rem, this is step 0"
    assert to_removed[0].payload["metadata"] == {"sequence": "drip", "enrollment_id": removed["id"], "step": 0}
    assert sorted(r.webhook_id for r in received if r.payload["recipient"] == "user-kept") == sorted(kept_ids)

    statuses = dict(Notification.objects.values_list("id", "status"))
    assert [statuses[n] for n in map(uuid.UUID, removed_ids)] == ["delivered", "cancelled", "cancelled"]
    assert {statuses[uuid.UUID(n)] for n in kept_ids} == {"delivered"}
    jobs = dict(ScheduledJob.objects.values_list("notification_id", "status"))
    assert [jobs[uuid.UUID(n)] for n in removed_ids[1:]] == ["cancelled", "cancelled"]
    assert DeliveryAttempt.objects.filter(notification_id__in=removed_ids).count() == 1
    assert not QueueItem.objects.exists()
    detail = api_a.get(f"{url}/{removed['id']}").json()
    assert detail["state"] == "cancelled"
    assert [s["status"] for s in detail["steps"]] == ["delivered", "cancelled", "cancelled"]


# --- the admin ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_admin_shows_enrollments_with_their_steps_and_the_recipient_masked(setup_a):
    from django.contrib.auth import get_user_model
    from django.test import Client

    email_sequence(setup_a.tenant)
    enrollment = sequences.enroll(setup_a.tenant, "drip", recipient=EMAIL, context={"name": "J"}, actor=ACTOR)
    sequences.unenroll(setup_a.tenant, "drip", enrollment.pk, actor=ACTOR)
    client = Client()
    client.force_login(get_user_model().objects.create_superuser(username="root", password="not-used-here"))
    pages = {
        "enrollment": f"/admin/workflows/workflowrun/{enrollment.pk}/change/",  # an enrollment is a run
        "enrollments": "/admin/workflows/workflowrun/",
        "sequence": f"/admin/workflows/workflow/{enrollment.workflow_id}/change/",
    }
    html = {}
    for name, url in pages.items():
        response = client.get(url)
        assert response.status_code == 200, url
        html[name] = response.content.decode()
        assert EMAIL not in html[name], url
    assert "j***@example.com" in html["enrollment"] and "j***@example.com" in html["enrollments"]
    for note in step_notes(enrollment.pk):
        assert f"/admin/notifications/notification/{note.pk}/change/" in html["enrollment"]
    assert "Cancelled" in html["enrollment"]  # the run's status
    assert all(f"drip{i}" in html["sequence"] for i in range(3))
