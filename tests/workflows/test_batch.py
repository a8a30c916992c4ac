"""The engine advances due runs in batches: a fixed number of statements per batch whatever its runs'
count (their notifications through the batch creation path, their states in one UPDATE, their waits'
jobs in one INSERT); a send to a channel without an address is skipped inside the batch; a run that
cannot advance fails alone while the rest of its batch goes on."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from notifications.models import Notification
from queueing.models import ScheduledJob
from templating.models import Template
from workflows import engine
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db

HELLO = {"name": "hello", "type": "send", "channel": "in_app", "subject": "Hi", "body": "Hello {{ data.n }}"}
WAIT = {"name": "wait", "type": "delay", "seconds": 3600}


def define(api, key: str, steps: list[dict]) -> None:  # noqa: ANN001
    made = api.post("/api/v1/workflows", {"key": key, "steps": steps}, format="json")
    assert made.status_code == 201, made.content


def trigger(api, key: str, people: list[str], **data) -> None:  # noqa: ANN001
    response = api.post(f"/api/v1/workflows/{key}/trigger", {"subscribers": people, "data": data}, format="json")
    assert response.status_code == 202, response.content


def promote() -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        result = engine.promote(engine.BATCH, "default")
    assert result.cancelled == 0
    return [q["sql"] for q in queries.captured_queries]


def test_a_batch_costs_the_same_statements_for_2_and_50_runs(api_a, tenant_a):
    define(api_a, "greet", [HELLO, WAIT, {**HELLO, "name": "again"}])
    counts = []
    for n in (1, 2, 50):  # the first warms this process's copy of the tenant's configuration
        trigger(api_a, "greet", [f"user-{n}-{i}" for i in range(n)], n=n)
        counts.append(len(promote()))
    assert counts[1] == counts[2] <= 16, counts  # with the jobs still waited on and the runs' tenants and workflows
    runs = list(WorkflowRun.objects.all())
    assert len(runs) == 53 and {run.status for run in runs} == {"waiting"}
    notes = {str(n.pk): n for n in Notification.objects.filter(channel="in_app")}
    assert len(notes) == 53
    for run in runs:
        hello, wait, again = run.steps
        assert hello["status"] == "done" and notes[hello["notification_id"]].body == f"Hello {run.data['n']}"
        assert notes[hello["notification_id"]].metadata["workflow_run_id"] == str(run.pk)
        assert wait["status"] == "waiting" and again["status"] == "pending"
    assert ScheduledJob.objects.filter(kind="workflow", status="pending").count() == 53


def test_no_address_is_skipped_and_a_failing_run_fails_alone(api_a, tenant_a, setup_a):
    assert api_a.put("/api/v1/subscribers/jane", {"email": "jane@example.org"}, format="json").status_code == 201
    Template.objects.create(tenant=tenant_a, key="doomed", channel="in_app", body="soon gone")
    define(api_a, "mail", [{"name": "mail", "type": "send", "channel": "email", "subject": "S", "body": "B"}, HELLO])
    define(api_a, "doomed", [{"name": "doomed", "type": "send", "channel": "in_app", "template": "doomed"}])
    Template.objects.filter(key="doomed").delete()  # the step's template is gone: its run cannot send
    trigger(api_a, "mail", ["jane", "nomail"])
    trigger(api_a, "doomed", ["jane"])
    promote()
    runs = {(r.workflow.key, r.subscriber): r for r in WorkflowRun.objects.select_related("workflow")}
    assert runs["doomed", "jane"].status == "failed" and "doomed" in runs["doomed", "jane"].steps[0]["reason"]
    jane, nomail = runs["mail", "jane"], runs["mail", "nomail"]
    assert jane.status == nomail.status == "completed"
    assert [s["status"] for s in jane.steps] == ["done", "done"]
    assert [(s["status"], s["reason"]) for s in nomail.steps] == [("skipped", "no_address"), ("done", None)]
    assert Notification.objects.count() == 3  # jane's email and in-app, nomail's in-app
    assert set(ScheduledJob.objects.filter(kind="workflow").values_list("status", flat=True)) == {"executed"}


def test_a_batch_waits_until_each_subscribers_morning(api_a, tenant_a):
    for external_id, zone in (("kiwi", "Pacific/Auckland"), ("nyc", "America/New_York")):
        assert api_a.put(f"/api/v1/subscribers/{external_id}", {"timezone": zone}, format="json").status_code == 201
    define(api_a, "morning", [{"name": "morning", "type": "delay", "until_local": "09:00"}])
    trigger(api_a, "morning", ["kiwi", "nyc", "nobody"])
    now = datetime(2026, 10, 31, 14, 0, tzinfo=UTC)  # Auckland Sunday 03:00 NZDT; New York Saturday 10:00 EDT
    with transaction.atomic():
        engine._advance_batch(list(WorkflowRun.objects.select_related("tenant", "workflow")), now, "default")
    at = {r.subscriber: r.steps[0]["at"] for r in WorkflowRun.objects.all()}
    assert at == {"kiwi": "2026-10-31T20:00:00+00:00", "nyc": "2026-11-01T14:00:00+00:00",
                  "nobody": "2026-11-01T09:00:00+00:00"}  # fmt: skip
