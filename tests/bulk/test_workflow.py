"""Bulk sends through a workflow: each row (a subscriber and its data columns) becomes exactly one run
of the job's trigger id, unknown subscribers are created, progress counts runs, test mode is kept."""

from __future__ import annotations

import pytest

from bulk import engine
from bulk.models import BulkSend, BulkSendChunk
from bulk.services import JOB_KIND
from core.models import ApiKey
from notifications.models import Notification
from queueing import schedule
from queueing.models import ScheduledJob
from recipients.models import Subscriber
from tests.bulk.test_api import URL, run_all
from tests.conftest import client_for
from workflows import engine as runs_engine
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db

HELLO = {"name": "hello", "type": "send", "channel": "in_app", "subject": "Hi {{ data.name }}",
         "body": "Your plan: {{ data.plan }}"}  # fmt: skip


def define(api, steps=None) -> None:  # noqa: ANN001
    made = api.post("/api/v1/workflows", {"key": "welcome", "steps": steps or [HELLO]}, format="json")
    assert made.status_code == 201, made.content


def upload(api, text: str, **extra):  # noqa: ANN001, ANN201
    return api.post(URL, {"csv": text, "workflow": "welcome", **extra}, format="json")


def rows(count: int) -> str:
    return "subscriber,name,plan\n" + "".join(f"s{row},Name {row},gold\n" for row in range(1, count + 1))


def test_each_row_is_one_run_with_its_data_once_even_when_chunks_run_twice(api_a, tenant_a):
    define(api_a)
    Subscriber.objects.create(tenant=tenant_a, external_id="s2")
    response = upload(api_a, rows(1500), name="launch")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["status"], body["rows"], body["workflow"], body["template"], body["channel"]) == (
        "ready", 1500, "welcome", None, None)  # fmt: skip
    assert not WorkflowRun.objects.exists() and Subscriber.objects.count() == 1  # nothing before start
    assert api_a.post(f"{URL}/{body['id']}/start").status_code == 202

    payloads = {c.pk: c.payload for c in BulkSendChunk.objects.filter(bulk_send_id=body["id"])}
    assert run_all() == 2
    # the chunks run twice (as if each had committed its runs but none of its bookkeeping)
    for pk, payload in payloads.items():
        chunk = BulkSendChunk.objects.get(pk=pk)
        chunk.payload = payload
        chunk.save(update_fields=["payload"])
    BulkSend.objects.filter(pk=body["id"]).update(rows_done=0, status="sending", completed_at=None)
    ScheduledJob.objects.filter(kind="bulk_send").delete()
    first = BulkSendChunk.objects.get(bulk_send_id=body["id"], first_row=1)
    schedule.add_timed_jobs(tenant_a.pk, JOB_KIND, [(first.pk, None, -60.0)])
    assert run_all() == 2
    runs = WorkflowRun.objects.filter(trigger_id=body["id"])
    assert runs.count() == 1500
    assert ScheduledJob.objects.filter(kind="workflow").count() == 1500  # each run's first step: one job
    assert sorted(runs.values_list("subscriber", flat=True)) == sorted(f"s{row}" for row in range(1, 1501))
    run = runs.get(subscriber="s17")
    assert run.data == {"name": "Name 17", "plan": "gold"} and run.status == "running" and not run.test
    assert Subscriber.objects.for_tenant(tenant_a).count() == 1500  # the unknown ones created, no addresses
    assert Subscriber.objects.get(external_id="s17").email is None
    assert not Notification.objects.filter(bulk_send_id=body["id"]).exists()  # runs, not notifications

    detail = api_a.get(f"{URL}/{body['id']}").json()
    assert detail["status"] == "completed"
    assert detail["progress"] == {"created": 1500, "delivered": 0, "failed": 0, "suppressed": 0, "pending": 1500}
    listed = api_a.get(f"/api/v1/workflow-runs?trigger_id={body['id']}").json()["results"]
    assert listed and {(r["workflow"], r["trigger_id"]) for r in listed} == {("welcome", body["id"])}

    while runs_engine.promote(500, "default").claimed:  # the runs' one step: an in-app send each
        pass
    assert runs.filter(status="completed").count() == 1500
    assert Notification.objects.filter(subject="Hi Name 17").count() == 1
    runs.filter(subscriber__in=["s1", "s2"]).update(status="failed")
    runs.filter(subscriber="s3").update(status="throttled")
    progress = api_a.get(f"{URL}/{body['id']}").json()["progress"]
    assert progress == {"created": 1500, "delivered": 1497, "failed": 2, "suppressed": 1, "pending": 0}


def test_the_same_rows_started_twice_in_one_chunk_make_no_second_run(api_a, tenant_a):
    """The second guard: a chunk whose runs exist (its transaction replayed) adds none."""
    define(api_a)
    body = upload(api_a, rows(3)).json()
    api_a.post(f"{URL}/{body['id']}/start")
    bulk = BulkSend.objects.select_related("tenant", "workflow").get(pk=body["id"])
    payload = [["s1", {"name": "A", "plan": "p"}], ["s2", {"name": "B", "plan": "p"}]]
    engine._start_runs(bulk, payload)
    engine._start_runs(bulk, payload)
    assert WorkflowRun.objects.filter(trigger_id=bulk.pk).count() == 2
    assert ScheduledJob.objects.filter(kind="workflow").count() == 2


def test_workflow_upload_errors_name_row_and_column(api_a, tenant_a):
    define(api_a)
    text = ("subscriber,name,plan\n"
            "jane,Jane,gold\n"
            ",Nobody,gold\n"
            "bad/id,X,gold\n"
            "jane,Again,gold\n"
            "kim,Kim\n"
            "lee,,\n"
            "sam,Sam,gold,extra\n")  # fmt: skip
    response = upload(api_a, text)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "invalid" and body["rows"] == 7
    assert [(e["row"], e["column"]) for e in body["errors"]] == [
        (2, "subscriber"), (3, "subscriber"), (4, "subscriber"), (5, "plan"), (7, None)]  # fmt: skip
    assert "also in row 1" in body["errors"][2]["message"]
    assert api_a.post(f"{URL}/{body['id']}/start").status_code == 409
    assert not Subscriber.objects.exists()  # nobody is created by an upload


def test_workflow_options_and_header_problems_are_400(api_a, setup_a):
    define(api_a)
    response = upload(api_a, "recipient,name\na@example.com,A\n")
    assert response.status_code == 400 and "subscriber" in response.json()["error"]["details"]["file"][0]
    response = upload(api_a, "subscriber,recipient\njane,a@example.com\n")
    assert response.status_code == 400 and "recipient" in response.json()["error"]["details"]["file"][0]
    response = api_a.post(URL, {"csv": "subscriber\njane\n", "workflow": "nope"}, format="json")
    assert response.status_code == 400 and "no workflow" in response.json()["error"]["details"]["workflow"][0]
    response = upload(api_a, "subscriber\njane\n", template="welcome", channel="email")
    details = response.json()["error"]["details"]
    assert response.status_code == 400 and set(details) == {"template", "channel"}
    big = "subscriber,note\njane," + "x" * 40_000 + "\n"
    body = upload(api_a, big.replace("x" * 40_000, "x" * 30_000 + "," + "y")).json()  # too many cells
    assert body["status"] == "invalid"
    body = upload(api_a, "subscriber,a,b\njane," + "x" * 20_000 + "," + "y" * 20_000 + "\n").json()
    assert body["status"] == "invalid" and body["errors"][0]["column"] is None
    assert "bytes" in body["errors"][0]["message"]
    assert not BulkSend.objects.filter(status="ready").exists()


def test_a_test_keys_workflow_job_makes_test_runs(api_a, tenant_a):
    define(api_a)
    test_api = client_for(ApiKey.issue(tenant_a, name="test", test=True)[1])
    body = upload(test_api, rows(2)).json()
    assert body["test"] is True and body["status"] == "ready"
    assert test_api.post(f"{URL}/{body['id']}/start").status_code == 202
    run_all()
    assert list(WorkflowRun.objects.filter(trigger_id=body["id"]).values_list("test", flat=True)) == [True, True]
    assert api_a.get(f"/api/v1/workflow-runs?trigger_id={body['id']}").json()["results"] == []
    assert len(test_api.get(f"/api/v1/workflow-runs?trigger_id={body['id']}").json()["results"]) == 2


def test_a_workflow_named_by_a_bulk_send_cannot_be_deleted(api_a):
    define(api_a)
    upload(api_a, rows(1))
    response = api_a.delete("/api/v1/workflows/welcome")
    assert response.status_code == 409
