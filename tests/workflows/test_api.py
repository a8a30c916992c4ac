"""The workflows API: definitions with field-level errors, tenant isolation, triggers (limits,
Idempotency-Key, subscribers created on first mention), runs listed with filters, cancel."""

from __future__ import annotations

import pytest

from queueing.models import ScheduledJob
from recipients.models import Subscriber
from templating.models import Template
from workflows.models import Workflow, WorkflowRun

pytestmark = pytest.mark.django_db

SEND = {"name": "hello", "type": "send", "channel": "in_app", "subject": "Hi", "body": "Hi {{ data.name }}"}
DELAY = {"name": "wait", "type": "delay", "seconds": 3600}
LATER = {"name": "later", "type": "send", "channel": "email", "subject": "Hi", "body": "Still there?",
         "skip_if": {"step": "hello", "state": "read"}}  # fmt: skip


def define(api, key="welcome", steps=None, **fields):  # noqa: ANN001, ANN201
    return api.post("/api/v1/workflows", {"key": key, "name": "Welcome", "steps": steps or [SEND, DELAY, LATER],
                                          **fields}, format="json")  # fmt: skip


def test_a_workflow_is_created_read_patched_and_deleted(api_a):
    made = define(api_a)
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["key"], body["name"], body["category"], body["steps"]) == (
        "welcome", "Welcome", "general", [SEND, DELAY, LATER])  # fmt: skip
    assert define(api_a).status_code == 409
    assert api_a.get("/api/v1/workflows/welcome").json()["steps"] == [SEND, DELAY, LATER]
    assert [w["key"] for w in api_a.get("/api/v1/workflows").json()["results"]] == ["welcome"]
    patched = api_a.patch("/api/v1/workflows/welcome", {"name": "Hello", "steps": [SEND]}, format="json")
    assert patched.status_code == 200 and patched.json()["steps"] == [SEND] and patched.json()["name"] == "Hello"
    assert api_a.patch("/api/v1/workflows/welcome", {"key": "other"}, format="json").status_code == 400
    assert api_a.delete("/api/v1/workflows/welcome").status_code == 204
    assert api_a.get("/api/v1/workflows/welcome").status_code == 404


@pytest.mark.parametrize(
    ("steps", "where", "field"),
    [
        ([{"name": f"s{i}", "type": "delay", "seconds": 1} for i in range(21)], None, None),
        ([SEND, {**SEND}], "1", "name"),
        ([{"name": "x", "type": "wait"}], "0", "type"),
        ([{"name": "x", "type": "delay"}], "0", "seconds"),
        ([{"name": "x", "type": "delay", "seconds": 5, "until_local": "09:00"}], "0", "seconds"),
        ([{"name": "x", "type": "delay", "until_local": "9am"}], "0", "until_local"),
        ([{"name": "x", "type": "send", "channel": "fax", "body": "b"}], "0", "channel"),
        ([{"name": "x", "type": "send", "channel": "email"}], "0", "body"),
        ([{"name": "x", "type": "send", "channel": "email", "body": "b", "seconds": 3}], "0", "seconds"),
        ([LATER, SEND], "0", "skip_if"),  # skip_if names a later step
        ([SEND, {**LATER, "skip_if": {"step": "hello", "state": "opened"}}], "1", "skip_if"),
        ([{"name": "d", "type": "digest", "window_seconds": 0}], "0", "window_seconds"),
        ([{"name": "d", "type": "digest", "window_seconds": 60, "key": "a..b"}], "0", "key"),
        ([{"name": "t", "type": "throttle", "window_seconds": 60, "limit": 0}], "0", "limit"),
        ([{"name": "x", "type": "send", "channel": "email", "template": "missing"}], "0", "template"),
    ],
)
def test_invalid_steps_are_400_naming_the_index_and_field(api_a, steps, where, field):
    response = define(api_a, steps=steps)
    assert response.status_code == 400, response.content
    details = response.json()["error"]["details"]["steps"]
    if where is None:
        assert "at most 20 steps" in details[0]
    else:
        assert field in details[where], details
    assert not Workflow.objects.exists()


def test_a_template_of_another_channel_and_an_unknown_category_are_400(api_a, tenant_a):
    Template.objects.create(tenant=tenant_a, key="sms-hello", channel="sms", body="Hi")
    step = {"name": "x", "type": "send", "channel": "email", "template": "sms-hello"}
    response = define(api_a, steps=[step], category="nope")
    assert response.status_code == 400
    details = response.json()["error"]["details"]
    assert "category" in details and "channel 'sms'" in details["steps"]["0"]["template"][0]


def test_another_tenants_workflow_and_runs_are_404(api_a, api_b):
    assert define(api_a).status_code == 201
    run = api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["jane"]}, format="json")
    assert run.status_code == 202
    run_id = WorkflowRun.objects.get().pk
    for method, path in [
        ("get", "/api/v1/workflows/welcome"),
        ("patch", "/api/v1/workflows/welcome"),
        ("delete", "/api/v1/workflows/welcome"),
        ("post", "/api/v1/workflows/welcome/trigger"),
        ("post", "/api/v1/workflows/welcome/cancel"),
        ("get", f"/api/v1/workflow-runs/{run_id}"),
    ]:
        body = {"subscribers": ["x"], "cancellation_key": "k"} if method == "post" else None
        response = getattr(api_b, method)(path, body, format="json")
        assert response.status_code == 404, (method, path, response.content)
    assert api_b.get("/api/v1/workflow-runs").json()["results"] == []
    assert api_b.get("/api/v1/workflows").json()["results"] == []


def test_a_trigger_starts_one_run_per_subscriber_and_creates_unknown_ones(api_a, tenant_a):
    assert define(api_a).status_code == 201
    response = api_a.post("/api/v1/workflows/welcome/trigger",
                          {"subscribers": ["jane", "joe", "jane"], "data": {"name": "Jane"}, "cancellation_key": "c1",
                           "actor": "admin-1"}, format="json")  # fmt: skip
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["runs"] == 2 and len(body["trigger_id"]) == 36
    assert set(Subscriber.objects.for_tenant(tenant_a).values_list("external_id", flat=True)) == {"jane", "joe"}
    assert Subscriber.objects.get(external_id="joe").email is None
    runs = api_a.get(f"/api/v1/workflow-runs?trigger_id={body['trigger_id']}").json()["results"]
    assert {r["subscriber"] for r in runs} == {"jane", "joe"}
    run = runs[0]
    assert set(run) == {"id", "workflow", "subscriber", "trigger_id", "status", "steps", "created_at"}
    assert (run["workflow"], run["status"]) == ("welcome", "running")  # its first step is due
    assert [(s["name"], s["type"], s["status"]) for s in run["steps"]] == [
        ("hello", "send", "pending"), ("wait", "delay", "pending"), ("later", "send", "pending")]  # fmt: skip
    assert api_a.get(f"/api/v1/workflow-runs/{run['id']}").json() == run
    assert ScheduledJob.objects.filter(kind="workflow", status="pending").count() == 2
    # the scheduled-jobs API shows notifications' jobs only
    assert api_a.get("/api/v1/scheduled-jobs").json()["results"] == []
    filtered = api_a.get("/api/v1/workflow-runs?subscriber=joe&workflow=welcome&status=running").json()["results"]
    assert [r["subscriber"] for r in filtered] == ["joe"]
    assert api_a.get("/api/v1/workflow-runs?status=nope").status_code == 400
    assert api_a.get("/api/v1/workflow-runs?colour=red").status_code == 400


def test_trigger_limits_are_400_and_create_nobody(api_a):
    assert define(api_a).status_code == 201
    many = api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": [f"u{i}" for i in range(1001)]},
                      format="json")  # fmt: skip
    assert many.status_code == 400 and "subscribers" in many.json()["error"]["details"]
    big = api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["jane"], "data": {"x": "a" * 32761}},
                     format="json")  # fmt: skip
    assert big.status_code == 400 and "data" in big.json()["error"]["details"]
    fits = {"x": "a" * (32 * 1024 - len('{"x":""}'))}
    assert api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["jane"], "data": fits},
                      format="json").status_code == 202  # fmt: skip
    bad = api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["a/b"], "data": []}, format="json")
    assert bad.status_code == 400 and set(bad.json()["error"]["details"]) == {"subscribers", "data"}
    assert api_a.post("/api/v1/workflows/nope/trigger", {"subscribers": ["jane"]}, format="json").status_code == 404
    assert Subscriber.objects.count() == 1 and WorkflowRun.objects.count() == 1


def test_a_trigger_with_an_idempotency_key_runs_once(api_a):
    assert define(api_a).status_code == 201
    body = {"subscribers": ["jane", "joe"], "data": {"n": 1}}
    first = api_a.post("/api/v1/workflows/welcome/trigger", body, format="json", HTTP_IDEMPOTENCY_KEY="t-1")
    again = api_a.post("/api/v1/workflows/welcome/trigger", body, format="json", HTTP_IDEMPOTENCY_KEY="t-1")
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    other = api_a.post("/api/v1/workflows/welcome/trigger", {**body, "data": {"n": 2}}, format="json",
                       HTTP_IDEMPOTENCY_KEY="t-1")  # fmt: skip
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert WorkflowRun.objects.count() == 2


def test_cancel_stops_matching_runs_and_says_zero_on_a_repeat(api_a):
    assert define(api_a).status_code == 201
    for key, who in (("k1", ["jane", "joe"]), ("k2", ["jane"])):
        api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": who, "cancellation_key": key}, format="json")
    only_joe = api_a.post("/api/v1/workflows/welcome/cancel", {"cancellation_key": "k1", "subscribers": ["joe"]},
                          format="json")  # fmt: skip
    assert only_joe.status_code == 200 and only_joe.json() == {"cancelled": 1}
    rest = api_a.post("/api/v1/workflows/welcome/cancel", {"cancellation_key": "k1"}, format="json")
    assert rest.json() == {"cancelled": 1}
    assert api_a.post("/api/v1/workflows/welcome/cancel", {"cancellation_key": "k1"}, format="json").json() == {
        "cancelled": 0}  # fmt: skip
    assert api_a.post("/api/v1/workflows/welcome/cancel", {}, format="json").status_code == 400
    statuses = sorted(WorkflowRun.objects.values_list("cancellation_key", "status"))
    assert statuses == [("k1", "cancelled"), ("k1", "cancelled"), ("k2", "running")]
    assert ScheduledJob.objects.filter(kind="workflow", status="cancelled").count() == 2
    assert api_a.delete("/api/v1/workflows/welcome").status_code == 409  # k2's run is not finished
