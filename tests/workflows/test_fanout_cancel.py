"""Cancelling a topic fan-out's runs: in chunks, each shared job cancelled with its last run, exact
counts; a cancel's statements do not grow with its runs (set-based chunks, the notifications they
scheduled included)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.models import AuditEvent
from notifications.models import Notification
from queueing.models import ScheduledJob
from recipients.models import Subscriber
from tests import factories
from tests.workflows.test_fanout import define, fan_out_all, setup_topic, trigger
from workflows import engine, services
from workflows.models import WorkflowRun, resolve_runs

pytestmark = pytest.mark.django_db

MEMBERS = [f"u{i:02d}" for i in range(25)]


def cancel(api, body, key="notice"):  # noqa: ANN001, ANN201
    response = api.post(f"/api/v1/workflows/{key}/cancel", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["cancelled"]


def run_engine() -> None:
    while engine.promote(100, "default").promoted:
        pass


def statuses(trigger_id) -> dict[str, str]:  # noqa: ANN001
    return dict(WorkflowRun.objects.filter(trigger_id=trigger_id).values_list("subscriber", "status"))


def test_a_cancel_in_chunks_stops_every_run_once_and_cancels_each_shared_job_with_its_last_run(
    api_a, monkeypatch
):  # fmt: skip
    monkeypatch.setattr(services, "CANCEL_CHUNK", 7)
    define(api_a)
    setup_topic(api_a, members=MEMBERS)
    body = trigger(api_a, {"topic": "outage", "cancellation_key": "k"}).json()
    fan_out_all()
    keep = trigger(api_a, {"topic": "outage", "cancellation_key": "keep"}).json()
    fan_out_all()
    assert ScheduledJob.objects.filter(kind="workflow", status="pending").count() == 2  # one per fan-out
    assert cancel(api_a, {"cancellation_key": "k"}) == 25  # four chunks: 7, 7, 7, 4
    assert set(statuses(body["trigger_id"]).values()) == {"cancelled"}
    assert set(statuses(keep["trigger_id"]).values()) == {"running"}
    jobs = ScheduledJob.objects.filter(kind="workflow").values_list("notification_id", "status")
    wakes = {run.wake_id for run in WorkflowRun.objects.filter(trigger_id=keep["trigger_id"])}
    assert sorted(status for _, status in jobs) == ["cancelled", "pending"]
    assert {opaque for opaque, status in jobs if status == "pending"} == wakes
    assert cancel(api_a, {"cancellation_key": "k"}) == 0


def quiet_broadcast(api, tenant, members: list[str]) -> str:  # noqa: ANN001
    """A fan-out to `members` of an email held by general's quiet hours, then a delay: after the engine,
    each run waits on the delay with its first step's notification `scheduled`."""
    now = timezone.now()
    quiet = {"start": f"{(now - timedelta(hours=1)):%H}:00", "end": f"{(now + timedelta(hours=2)):%H}:00"}
    assert api.patch("/api/v1/categories/general", {"quiet_hours": quiet}, format="json").status_code == 200
    factories.provider(tenant, "mail", kind="console", channel="email", is_default=True, config={})
    steps = [{"name": "mail", "type": "send", "channel": "email", "subject": "Hi", "body": "Down"},
             {"name": "wait", "type": "delay", "seconds": 3600}]  # fmt: skip
    assert api.post("/api/v1/workflows", {"key": "quiet", "steps": steps}, format="json").status_code == 201
    api.put("/api/v1/topics/quiet", {"name": "quiet"}, format="json")
    assert api.post("/api/v1/topics/quiet/subscribers", {"subscribers": members}, format="json").status_code == 200
    Subscriber.objects.for_tenant(tenant).filter(external_id__in=members).update(email="x@example.com")
    body = trigger(api, {"topic": "quiet", "cancellation_key": "quiet"}, key="quiet").json()
    fan_out_all()
    run_engine()
    return body["trigger_id"]


@pytest.mark.parametrize("size", [3, 30])
def test_a_cancels_statements_are_as_many_for_3_runs_as_for_30(api_a, tenant_a, size):
    trigger_id = quiet_broadcast(api_a, tenant_a, [f"q{i:02d}" for i in range(size)])
    runs = list(WorkflowRun.objects.filter(trigger_id=trigger_id))
    assert {r.status for r in runs} == {"waiting"} and len(runs) == size
    held = Notification.objects.for_tenant(tenant_a)
    assert held.count() == size and set(held.values_list("status", flat=True)) == {"scheduled"}
    with CaptureQueriesContext(connection) as queries:
        assert services.cancel(tenant_a, "quiet", "quiet", subscribers=None, actor="t") == size
    assert len(queries.captured_queries) == EXPECTED_QUERIES, [q["sql"][:80] for q in queries.captured_queries]
    assert set(held.values_list("status", flat=True)) == {"cancelled"}
    assert not ScheduledJob.objects.filter(status="pending").exists()  # the delays' and the emails' jobs
    stopped = list(WorkflowRun.objects.filter(trigger_id=trigger_id))
    resolve_runs(stopped)
    assert {(r.status, tuple((s["status"], s["reason"]) for s in r.steps)) for r in stopped} == {
        ("cancelled", (("done", None), ("skipped", "cancelled")))}  # fmt: skip
    assert AuditEvent.objects.filter(action="notification.cancelled").count() == size


# The workflow; its fan-outs FOR UPDATE (in a savepoint: 3); one chunk in a savepoint (2): the pick with
# the runs' jobs, the runs, then the notifications' jobs, the notifications, their fallbacks (2) and
# their audit rows; the workflow's audit row. The same for 3 runs as for 30: none per run.
EXPECTED_QUERIES = 14
