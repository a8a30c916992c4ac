"""Runs advanced by the real scheduler (in-process, `run(once=True)`) and delivered by the real dispatcher
(`--once` mode): send → delay → send end to end with an SMTP sink, skip_if on an in-app read, a step to a
channel the subscriber has no address for, cancel during a delay (with a notification held by quiet
hours), throttle and digest. Time passes by moving the waiting jobs' run_at to the database's now()."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from dispatch.dispatcher import Dispatcher, DispatcherConfig
from notifications.models import Notification
from queueing.models import ScheduledJob
from queueing.scheduler import Scheduler
from tests import factories
from tests.conftest import client_for
from workflows.models import WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

EMAIL = "jane.canary@example.org"
HELLO = {"name": "hello", "type": "send", "channel": "in_app", "subject": "Hi {{ data.name }}", "body": "Welcome"}
WAIT = {"name": "wait", "type": "delay", "seconds": 3600}
NUDGE = {"name": "nudge", "type": "send", "channel": "email", "subject": "Still there, {{ data.name }}?",
         "body": "Come back, {{ data.name }}", "skip_if": {"step": "hello", "state": "read"}}  # fmt: skip


def schedule() -> int:
    scheduler = Scheduler(jitter=0, interval=0.2)
    scheduler.run(once=True)
    return scheduler.promoted_total


def dispatch() -> None:
    assert Dispatcher(DispatcherConfig(once=True, jitter=False)).run() == 0


def time_passes() -> int:
    """The waiting runs' jobs become due (as if their time had come, by the database's clock)."""
    return ScheduledJob.objects.filter(kind="workflow", status="pending").update(run_at=Now())


def setup(api, tenant, sink=None, *, steps=None, email: str | None = EMAIL, **subscriber) -> None:  # noqa: ANN001
    if sink is not None:
        factories.provider(
            tenant,
            "mail",
            kind="smtp",
            channel="email",
            is_default=True,
            secrets={},
            config={"host": "127.0.0.1", "port": sink.port, "from_email": "noreply@omnipost.test"},
        )
    fields = {"email": email, **subscriber} if email else subscriber
    assert api.put("/api/v1/subscribers/jane", fields, format="json").status_code == 201
    made = api.post("/api/v1/workflows", {"key": "welcome", "steps": steps or [HELLO, WAIT, NUDGE]}, format="json")
    assert made.status_code == 201, made.content


def trigger(api, **body) -> dict:  # noqa: ANN001
    response = api.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["jane"], "data": {"name": "Jane"},
                                                              **body}, format="json")  # fmt: skip
    assert response.status_code == 202, response.content
    return response.json()


def the_run(api) -> dict:  # noqa: ANN001
    (run,) = api.get("/api/v1/workflow-runs").json()["results"]
    return run


def test_send_delay_send_through_the_scheduler_and_the_dispatcher(api_a, tenant_a, smtp_sink):
    setup(api_a, tenant_a, smtp_sink)
    trigger(api_a)
    assert schedule() == 1
    run = the_run(api_a)
    hello, wait, nudge = run["steps"]
    assert run["status"] == "waiting"
    assert (hello["status"], wait["status"], nudge["status"]) == ("done", "waiting", "pending")
    first = Notification.objects.get(pk=hello["notification_id"])
    assert (first.channel, first.subject, first.status, first.subscriber) == ("in_app", "Hi Jane", "queued", "jane")
    waits_until = timezone.datetime.fromisoformat(wait["at"])
    assert timedelta(minutes=59) < waits_until - first.created_at < timedelta(minutes=61)
    dispatch()
    first.refresh_from_db()
    assert first.status == "delivered"
    assert schedule() == 0  # the delay has not ended: nothing moves
    assert Notification.objects.count() == 1

    assert time_passes() == 1
    assert schedule() == 1
    run = the_run(api_a)
    assert run["status"] == "completed"
    assert [s["status"] for s in run["steps"]] == ["done", "done", "done"]
    second = Notification.objects.get(pk=run["steps"][2]["notification_id"])
    assert (second.channel, second.category, second.metadata["step"]) == ("email", "general", "nudge")
    dispatch()
    assert smtp_sink.wait_for(1)
    (mail,) = smtp_sink.messages
    assert mail.message["Subject"] == "Still there, Jane?" and mail.rcpt_tos == [EMAIL]
    assert schedule() == 0 and Notification.objects.count() == 2  # each step once


def test_skip_if_read_skips_the_email_when_the_in_app_message_was_read(api_a, key_a, tenant_a, smtp_sink):
    setup(api_a, tenant_a, smtp_sink)
    trigger(api_a)
    schedule()
    dispatch()
    token = api_a.post("/api/v1/subscribers/jane/inbox-token", {}, format="json").json()["token"]
    inbox = client_for(None)
    inbox.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    (item,) = inbox.get("/inbox/v1/feed").json()["results"]
    assert inbox.post(f"/inbox/v1/feed/{item['id']}/read").status_code == 200
    time_passes()
    assert schedule() == 1
    run = the_run(api_a)
    assert run["status"] == "completed"
    nudge = run["steps"][2]
    assert (nudge["status"], nudge["reason"], nudge["notification_id"]) == ("skipped", "hello read", None)
    assert Notification.objects.filter(channel="email").count() == 0
    dispatch()
    assert smtp_sink.messages == []


def test_a_channel_without_an_address_is_skipped_as_no_address(api_a, tenant_a, smtp_sink):
    setup(api_a, tenant_a, smtp_sink, email=None, steps=[{**NUDGE, "skip_if": None} | {"name": "mail"}, HELLO])
    trigger(api_a)
    assert schedule() == 1
    run = the_run(api_a)
    assert run["status"] == "completed"
    assert [(s["name"], s["status"], s["reason"]) for s in run["steps"]] == [
        ("mail", "skipped", "no_address"), ("hello", "done", None)]  # fmt: skip


def test_cancel_stops_a_run_waiting_on_a_delay_and_cancels_its_scheduled_notification(api_a, tenant_a, smtp_sink):
    # general's quiet hours hold the first email (the subscriber's local time, UTC, is inside them)
    now = timezone.now()
    quiet = {"start": f"{(now - timedelta(hours=1)):%H}:00", "end": f"{(now + timedelta(hours=2)):%H}:00"}
    assert api_a.patch("/api/v1/categories/general", {"quiet_hours": quiet}, format="json").status_code == 200
    setup(
        api_a,
        tenant_a,
        smtp_sink,
        steps=[{**NUDGE, "name": "first", "skip_if": None}, WAIT, {**NUDGE, "name": "second", "skip_if": None}],
    )
    trigger(api_a, cancellation_key="order-7")
    assert schedule() == 1
    run = the_run(api_a)
    held = Notification.objects.get(pk=run["steps"][0]["notification_id"])
    assert held.status == "scheduled"
    cancelled = api_a.post("/api/v1/workflows/welcome/cancel", {"cancellation_key": "order-7"}, format="json")
    assert cancelled.status_code == 200 and cancelled.json() == {"cancelled": 1}
    held.refresh_from_db()
    assert held.status == "cancelled"
    run = the_run(api_a)
    assert run["status"] == "cancelled"
    assert [s["status"] for s in run["steps"]] == ["done", "skipped", "pending"]
    time_passes()
    schedule()
    assert Notification.objects.count() == 1  # the second email never comes
    assert the_run(api_a)["status"] == "cancelled"
    assert api_a.post("/api/v1/workflows/welcome/cancel", {"cancellation_key": "order-7"},
                      format="json").json() == {"cancelled": 0}  # fmt: skip


def test_a_throttle_of_three_lets_exactly_three_of_ten_runs_send(api_a, tenant_a):
    steps = [{"name": "cap", "type": "throttle", "limit": 3, "window_seconds": 60}, HELLO]
    setup(api_a, tenant_a, steps=steps)
    for _ in range(10):
        trigger(api_a)
    assert schedule() == 10
    statuses = sorted(WorkflowRun.objects.values_list("status", flat=True))
    assert statuses == ["completed"] * 3 + ["throttled"] * 7
    assert Notification.objects.count() == 3


def test_a_digest_sends_one_notification_counting_every_trigger(api_a, tenant_a):
    steps = [
        {"name": "collect", "type": "digest", "window_seconds": 300},
        {**HELLO, "subject": "{{ digest.count }} new", "body": "{% for i in digest.items %}{{ i.n }},{% endfor %}"},
    ]
    setup(api_a, tenant_a, steps=steps)
    for n in range(12):
        api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["jane"], "data": {"n": n}}, format="json")
    assert schedule() == 12
    assert sorted(WorkflowRun.objects.values_list("status", flat=True)) == ["digested"] * 11 + ["waiting"]
    assert Notification.objects.count() == 0
    time_passes()
    assert schedule() == 1
    (note,) = Notification.objects.all()
    assert note.subject == "12 new"
    assert sorted(int(n) for n in note.body.rstrip(",").split(",")) == list(range(12))
    assert sorted(WorkflowRun.objects.values_list("status", flat=True)) == ["completed"] + ["digested"] * 11
    # the next trigger opens a new window
    api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["jane"], "data": {"n": 99}}, format="json")
    assert schedule() == 1
    assert WorkflowRun.objects.filter(status="waiting").count() == 1


def test_a_test_keys_run_sends_test_notifications_to_the_simulator(api_a, tenant_a, smtp_sink):
    from core.models import ApiKey
    from inbox.models import InboxItem

    test_api = client_for(ApiKey.issue(tenant_a, name="test", test=True)[1])
    setup(test_api, tenant_a, smtp_sink, steps=[HELLO, {**NUDGE, "skip_if": None, "name": "mail"}])
    trigger(test_api)
    assert schedule() == 1
    run = the_run(test_api)
    assert run["status"] == "completed" and api_a.get("/api/v1/workflow-runs").json()["results"] == []
    sent = [Notification.objects.get(pk=s["notification_id"]) for s in run["steps"]]
    assert [(n.channel, n.test) for n in sent] == [("in_app", True), ("email", True)]
    dispatch()
    assert [Notification.objects.get(pk=n.pk).status for n in sent] == ["delivered", "delivered"]
    assert not InboxItem.objects.exists()  # simulated: no feed item
    assert smtp_sink.messages == []  # simulated: no mail
