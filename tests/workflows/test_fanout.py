"""Workflow triggers to a topic: the 202's count, one run per member at the trigger (the actor left
out, a member removed after the 202 still reached, one added after it not), chunks in id order
resumed from their cursor, field-level 400s, tenant isolation, /metrics. The kill -9 of a real
scheduler mid fan-out is in test_fanout_processes.py."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction
from django.db.models import Count

from core.api.errors import Conflict
from core.models import ApiKey
from queueing.models import ScheduledJob
from recipients.models import Topic, TopicSubscriber
from tests.conftest import client_for
from workflows import fanout, services
from workflows.models import Fanout, Workflow, WorkflowRun, resolve_runs

pytestmark = pytest.mark.django_db

STEPS = [{"name": "tell", "type": "send", "channel": "in_app", "subject": "Hi", "body": "Down for an hour"}]


def setup_topic(api, key="outage", members=()):  # noqa: ANN001, ANN201
    assert api.put(f"/api/v1/topics/{key}", {"name": key}, format="json").status_code in (200, 201)
    ids = list(members)
    for start in range(0, len(ids), 1000):
        response = api.post(f"/api/v1/topics/{key}/subscribers", {"subscribers": ids[start:start + 1000]},
                            format="json")  # fmt: skip
        assert response.status_code == 200, response.content


def define(api, key="notice"):  # noqa: ANN001, ANN201
    assert api.post("/api/v1/workflows", {"key": key, "steps": STEPS}, format="json").status_code == 201


def trigger(api, body, key="notice"):  # noqa: ANN001, ANN201
    return api.post(f"/api/v1/workflows/{key}/trigger", body, format="json")


def fan_out_all(chunk: int = 1000) -> int:
    chunks = 0
    while fanout.chunk_once(chunk=chunk) is not None:
        chunks += 1
    return chunks


def test_a_topic_trigger_makes_one_run_per_member_but_the_actor(api_a, tenant_a):
    define(api_a)
    setup_topic(api_a, members=[f"u{i:05d}" for i in range(2500)])
    response = trigger(api_a, {"topic": "outage", "data": {"eta": "1h"}, "actor": "u00007",
                               "cancellation_key": "outage-1"})  # fmt: skip
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["runs"] == 2499
    assert not WorkflowRun.objects.exists()  # asynchronous: the scheduler fans out
    assert fan_out_all(chunk=1000) == 3
    runs = WorkflowRun.objects.for_tenant(tenant_a).filter(trigger_id=body["trigger_id"])
    assert runs.count() == 2499 == runs.values("subscriber").distinct().count()
    assert not runs.filter(subscriber="u00007").exists()
    one = runs.first()
    # narrow rows: the data, definition and step states are the fan-out's until the run's first step
    assert (one.data, one.definition, one.steps) == (None, None, None)
    resolve_runs([one])
    assert (one.data, one.cancellation_key, one.actor, one.status) == ({"eta": "1h"}, "outage-1", "u00007", "running")
    assert (one.definition, [s["status"] for s in one.steps]) == (STEPS, ["pending"])
    # a job for each engine batch of a chunk's runs (1000 + 1000 + 499 runs: 2 + 2 + 1), waited on together
    jobs = ScheduledJob.objects.filter(kind="workflow_share", status="pending")
    assert jobs.count() == 5 == runs.values("wake_id").distinct().count()
    assert set(jobs.values_list("notification_id", flat=True)) == set(runs.values_list("wake_id", flat=True))
    sizes = sorted(runs.values("wake_id").annotate(n=Count("id")).values_list("n", flat=True))
    assert sizes == [499, 500, 500, 500, 500]
    done = Fanout.objects.get()
    assert (done.status, done.created, done.total, done.chunks) == ("completed", 2499, 2499, 3)
    assert ScheduledJob.objects.get(kind="fanout").status == "executed"
    assert Topic.objects.get().active_fanouts == 0
    listed = api_a.get(f"/api/v1/workflow-runs?trigger_id={body['trigger_id']}").json()
    assert len(listed["results"]) > 0, listed
    assert {s["status"] for run in listed["results"] for s in run["steps"]} == {"pending"}, listed
    alone = api_a.get(f"/api/v1/workflow-runs/{one.pk}").json()
    assert [s["name"] for s in alone["steps"]] == ["tell"], alone


def test_members_removed_after_the_trigger_still_get_a_run_and_new_ones_do_not(api_a, tenant_a):
    define(api_a)
    setup_topic(api_a, members=[f"u{i}" for i in range(50)])
    body = trigger(api_a, {"topic": "outage"}).json()
    assert body["runs"] == 50
    assert api_a.delete("/api/v1/topics/outage/subscribers", {"subscribers": ["u3", "u40"]},
                        format="json").json() == {"removed": 2}  # fmt: skip
    assert api_a.post("/api/v1/topics/outage/subscribers", {"subscribers": ["late", "u3"]},
                      format="json").json() == {"added": 2}  # fmt: skip
    assert api_a.get("/api/v1/topics/outage").json()["subscriber_count"] == 50
    assert api_a.delete("/api/v1/workflows/notice").status_code == 409
    fan_out_all(chunk=7)
    subscribers = set(WorkflowRun.objects.filter(trigger_id=body["trigger_id"]).values_list("subscriber", flat=True))
    assert subscribers == {f"u{i}" for i in range(50)}  # u3 and u40 included, late not; u3 once
    assert WorkflowRun.objects.filter(trigger_id=body["trigger_id"]).count() == 50
    # the fan-out over, removed memberships are gone; the live ones are the topic's count
    assert not TopicSubscriber.objects.filter(removed_seq__isnull=False).exists()
    assert TopicSubscriber.objects.count() == 50 == Topic.objects.get().subscriber_count
    # a second trigger sees the topic as it is now
    second = trigger(api_a, {"topic": "outage"}).json()
    fan_out_all()
    now = set(WorkflowRun.objects.filter(trigger_id=second["trigger_id"]).values_list("subscriber", flat=True))
    assert now == ({f"u{i}" for i in range(50)} - {"u40"}) | {"late"}


def test_a_repeated_chunk_creates_nothing_twice(api_a):
    define(api_a)
    setup_topic(api_a, members=[f"u{i}" for i in range(30)])
    body = trigger(api_a, {"topic": "outage"}).json()
    assert fanout.chunk_once(chunk=20) == 0
    # as if the chunk's runs had committed without the cursor: the same members come again
    Fanout.objects.update(cursor=0, created=0)
    fan_out_all(chunk=20)
    assert WorkflowRun.objects.filter(trigger_id=body["trigger_id"]).count() == 30
    # a job for each chunk that made runs: the first, and the repeat's second (the first chunk again made none)
    assert ScheduledJob.objects.filter(kind="workflow_share").count() == 2
    assert Fanout.objects.get().created == 10  # the repeat added none of the first twenty


def test_an_empty_topic_and_an_actor_who_is_not_a_member(api_a):
    define(api_a)
    setup_topic(api_a, members=["a", "b"])
    setup_topic(api_a, key="empty")
    assert trigger(api_a, {"topic": "empty"}).json()["runs"] == 0
    assert trigger(api_a, {"topic": "outage", "actor": "zed"}).json()["runs"] == 2
    fan_out_all()
    assert WorkflowRun.objects.count() == 2
    assert set(Fanout.objects.values_list("status", flat=True)) == {"completed"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"topic": "outage", "subscribers": ["a"]}, "topic"),
        ({"topic": "bad key"}, "topic"),
        ({"topic": 5}, "topic"),
        ({"topic": "missing"}, "topic"),
        ({"topic": "outage", "data": []}, "data"),
        ({"topic": "outage", "actor": "a/b"}, "actor"),
    ],
)
def test_bad_topic_triggers_are_400_naming_the_field(api_a, body, field):
    define(api_a)
    setup_topic(api_a, members=["a"])
    response = trigger(api_a, body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"]
    assert not Fanout.objects.exists()


def test_another_tenants_topic_is_not_found_and_never_fanned_out(api_a, api_b, tenant_b):
    define(api_a)
    define(api_b)
    setup_topic(api_a, members=["a1", "a2"])
    response = trigger(api_b, {"topic": "outage"})
    assert response.status_code == 400 and "topic" in response.json()["error"]["details"]
    setup_topic(api_b, members=["b1"])
    body = trigger(api_b, {"topic": "outage"}).json()
    assert body["runs"] == 1
    fan_out_all()
    assert list(WorkflowRun.objects.values_list("tenant_id", "subscriber")) == [(tenant_b.pk, "b1")]


def test_the_trigger_is_idempotent_with_its_key(api_a):
    define(api_a)
    setup_topic(api_a, members=["a", "b", "c"])
    first = api_a.post("/api/v1/workflows/notice/trigger", {"topic": "outage"}, format="json",
                       HTTP_IDEMPOTENCY_KEY="k1")  # fmt: skip
    again = api_a.post("/api/v1/workflows/notice/trigger", {"topic": "outage"}, format="json",
                       HTTP_IDEMPOTENCY_KEY="k1")  # fmt: skip
    assert first.status_code == again.status_code == 202
    assert first.json() == again.json() and again["Idempotent-Replayed"] == "true"
    assert Fanout.objects.count() == 1


def test_metrics_show_running_fan_outs_and_their_pending_chunks(api_a, client):
    define(api_a)
    setup_topic(api_a, members=[f"u{i}" for i in range(25)])
    trigger(api_a, {"topic": "outage"})
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    text = client.get("/metrics").content.decode()
    assert "omnipost_fanouts_running 1.0" in text
    assert "omnipost_fanout_pending_chunks 1.0" in text
    fan_out_all()
    text = client.get("/metrics").content.decode()
    assert "omnipost_fanouts_running 0.0" in text and "omnipost_fanout_pending_chunks 0.0" in text
    assert "omnipost_fanout_rows_per_second" in text


def test_the_fanned_out_runs_send_one_notification_each_made_together(api_a, tenant_a):
    from django.test.utils import CaptureQueriesContext

    from notifications.models import Notification
    from recipients.models import Subscriber
    from tests import factories
    from workflows import engine

    factories.provider(tenant_a, "mail", kind="console", channel="email", is_default=True, config={})
    email = [{"name": "mail", "type": "send", "channel": "email", "subject": "Hi", "body": "{{ data.eta }}"}]
    assert api_a.post("/api/v1/workflows", {"key": "mail", "steps": email}, format="json").status_code == 201
    setup_topic(api_a, members=[f"u{i:03d}" for i in range(150)])
    Subscriber.objects.for_tenant(tenant_a).filter(external_id__lt="u100").update(email="x@example.com")
    body = trigger(api_a, {"topic": "outage", "data": {"eta": "soon"}}, key="mail").json()
    fan_out_all()
    with CaptureQueriesContext(connection) as batch:
        assert engine.promote_shares(100, "default").promoted == 100
    assert len(batch.captured_queries) < 100 * 4, len(batch.captured_queries)  # not a creation per run
    while engine.promote_shares(100, "default").promoted:
        pass
    runs = WorkflowRun.objects.filter(trigger_id=body["trigger_id"])
    assert set(runs.values_list("status", flat=True)) == {"completed"}
    ids = [run.steps[0]["notification_id"] for run in runs if run.steps[0]["notification_id"]]
    assert len(ids) == len(set(ids)) == 100 == Notification.objects.for_tenant(tenant_a).count()
    assert {run.steps[0]["reason"] for run in runs if not run.steps[0]["notification_id"]} == {"no_address"}
    assert set(Notification.objects.values_list("body", flat=True)) == {"soon"}


def test_fanned_out_runs_take_their_fan_outs_data_through_sends_delays_and_conditions(api_a, tenant_a, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from notifications.models import Notification
    from workflows import engine

    monkeypatch.setattr(fanout, "BATCH", 7)  # jobs of 7 runs
    steps = [
        {"name": "first", "type": "send", "channel": "in_app", "subject": "Hi", "body": "Down {{ data.eta }}"},
        {"name": "wait", "type": "delay", "seconds": 3600},
        {"name": "again", "type": "send", "channel": "in_app", "subject": "Hi", "body": "Back {{ data.eta }}",
         "skip_if": {"step": "first", "state": "delivered"}},
    ]  # fmt: skip
    assert api_a.post("/api/v1/workflows", {"key": "two", "steps": steps}, format="json").status_code == 201
    setup_topic(api_a, members=[f"u{i:02d}" for i in range(30)])
    body = trigger(api_a, {"topic": "outage", "data": {"eta": "1h"}}, key="two").json()
    fan_out_all(chunk=10)
    runs = WorkflowRun.objects.filter(trigger_id=body["trigger_id"])
    assert runs.values("wake_id").distinct().count() == 6  # 7 + 3 in each chunk of 10
    while engine.promote_shares(100, "default").promoted:
        pass
    assert set(runs.values_list("status", flat=True)) == {"waiting"}
    # each share's runs wait for the delay's end together, on one job of the shares' kind again: a
    # broadcast's second step stays out of the single runs' turn
    assert runs.values("wake_id").distinct().count() == 6
    assert not ScheduledJob.objects.filter(kind="workflow").exists()
    assert runs.filter(data__isnull=True, definition__isnull=True).count() == 30  # still the fan-out's
    assert set(Notification.objects.values_list("body", flat=True)) == {"Down 1h"}
    first = runs.get(subscriber="u03").steps[0]["notification_id"]
    Notification.objects.filter(pk=first).update(status="delivered")
    waiting = ScheduledJob.objects.filter(kind="workflow_share", status="pending")
    assert waiting.count() == 6
    waiting.update(run_at=timezone.now() - timedelta(hours=1))
    while engine.promote_shares(100, "default").promoted:
        pass
    assert set(runs.values_list("status", flat=True)) == {"completed"}
    assert runs.get(subscriber="u03").steps[2]["reason"] == "first delivered"
    assert Notification.objects.filter(body="Back 1h").count() == 29
    assert not ScheduledJob.objects.filter(status="pending").exists()


def test_a_single_trigger_is_advanced_in_its_own_turn_not_behind_a_fan_outs_shares(api_a, tenant_a):
    from workflows import engine

    define(api_a)
    setup_topic(api_a, members=[f"u{i}" for i in range(7)])
    body = trigger(api_a, {"topic": "outage"}).json()
    fan_out_all()
    alone = trigger(api_a, {"subscribers": ["solo"]}).json()  # due after the fan-out's share
    assert engine.promote(4, "default").promoted == 1  # the single run's kind: only it
    assert WorkflowRun.objects.get(trigger_id=alone["trigger_id"]).status == "completed"
    shared = WorkflowRun.objects.filter(trigger_id=body["trigger_id"])
    assert not shared.filter(status="completed").exists()
    assert engine.promote_shares(4, "default").promoted == 4
    assert shared.filter(status="completed").count() == 4
    assert ScheduledJob.objects.filter(kind="workflow_share", status="pending").count() == 1  # 3 runs left on it
    assert engine.promote_shares(4, "default").promoted == 3
    assert set(shared.values_list("status", flat=True)) == {"completed"}
    assert set(ScheduledJob.objects.filter(kind="workflow_share").values_list("status", flat=True)) == {"executed"}
    assert engine.promote_shares(4, "default").promoted == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_two_schedulers_advance_two_shares_of_one_fan_out_at_once(api_a, tenant_a, monkeypatch):
    """A batch locks one share's job: a second scheduler takes the next share instead of finding nothing."""
    from queueing import scheduler
    from workflows import engine

    monkeypatch.setattr(fanout, "BATCH", 5)
    define(api_a)
    setup_topic(api_a, members=[f"u{i}" for i in range(10)])
    body = trigger(api_a, {"topic": "outage"}).json()
    fan_out_all()
    assert ScheduledJob.objects.filter(kind="workflow_share", status="pending").count() == 2
    peer: list[int] = []

    def second_scheduler() -> None:
        try:
            peer.append(engine.promote_shares(100, "default").promoted)
        finally:
            connections.close_all()

    with transaction.atomic():  # a scheduler mid-batch, holding the oldest share's job
        with connection.cursor() as cursor:
            cursor.execute(scheduler.due_jobs_sql(engine.SHARE_KIND), {"n": 1})
            held = cursor.fetchone()[1]
        worker = threading.Thread(target=second_scheduler)
        worker.start()
        worker.join(timeout=30)
    assert peer == [5]
    runs = WorkflowRun.objects.filter(trigger_id=body["trigger_id"])
    assert set(runs.filter(wake_id=held).values_list("status", flat=True)) == {"running"}
    assert set(runs.exclude(wake_id=held).values_list("status", flat=True)) == {"completed"}


def test_cancelling_some_fanned_out_runs_leaves_their_shared_job_to_the_others(api_a, tenant_a):
    from workflows import engine

    define(api_a)
    setup_topic(api_a, members=[f"u{i}" for i in range(6)])
    body = trigger(api_a, {"topic": "outage", "cancellation_key": "k"}).json()
    fan_out_all()
    cancel = api_a.post("/api/v1/workflows/notice/cancel", {"cancellation_key": "k", "subscribers": ["u1", "u2"]},
                        format="json")  # fmt: skip
    assert cancel.status_code == 200, cancel.content
    job = ScheduledJob.objects.get(kind="workflow_share")
    assert job.status == "pending"  # four runs still wait on it
    runs = WorkflowRun.objects.filter(trigger_id=body["trigger_id"])
    # it took no step: its states stay the fan-out's (NULL), every step pending, as the API shows them
    cancelled = runs.get(subscriber="u1")
    assert cancelled.steps is None
    resolve_runs([cancelled])
    assert [(s["status"], s["reason"]) for s in cancelled.steps] == [("pending", None)]
    assert engine.promote_shares(100, "default").promoted == 4
    assert dict(runs.values_list("subscriber", "status")) == {
        "u0": "completed", "u1": "cancelled", "u2": "cancelled", "u3": "completed", "u4": "completed",
        "u5": "completed"}  # fmt: skip
    job.refresh_from_db()
    assert job.status == "executed"
    # a cancel of every run of a job cancels the job
    second = trigger(api_a, {"topic": "outage", "cancellation_key": "k2"}).json()
    fan_out_all()
    api_a.post("/api/v1/workflows/notice/cancel", {"cancellation_key": "k2"}, format="json")
    assert set(WorkflowRun.objects.filter(trigger_id=second["trigger_id"]).values_list("status", flat=True)) == {
        "cancelled"}  # fmt: skip
    assert ScheduledJob.objects.filter(kind="workflow_share", status="pending").count() == 0


def test_a_fan_out_turn_lasts_as_long_as_the_schedulers_other_work_took_within_bounds(settings):
    settings.OMNIPOST_FANOUT_BUDGET_SECONDS = 0.5
    assert fanout.budget(None, 100.0) == 0.5  # the first turn
    assert fanout.budget(99.9, 100.0) == 0.5  # the others took little: the least
    assert fanout.budget(98.8, 100.0) == pytest.approx(1.2)  # a fair half
    assert fanout.budget(10.0, 100.0) == 2.0  # the scheduler slept meanwhile: at most SHARE_CAP times the least


def test_a_turn_stops_at_its_budget_between_chunks(api_a, settings):
    settings.OMNIPOST_FANOUT_BUDGET_SECONDS = 0.5
    define(api_a)
    setup_topic(api_a, members=[f"u{i}" for i in range(50)])
    trigger(api_a, {"topic": "outage"})
    settings.OMNIPOST_FANOUT_CHUNK = 10
    ticks = iter([0.0, 0.0, 0.0, 0.2, 0.4, 0.6, 0.6])  # the deadline's two readings, one before each chunk, the end

    assert fanout.promote(100, "default", clock=lambda: next(ticks)).promoted == 0
    assert Fanout.objects.get().chunks == 3  # at 0.6 the 0.5 s budget was over
    ticks = iter([5.6, 5.6, 5.6, 6.0, 7.0, 7.5, 8.0])  # 5 s of other work since: a 2 s turn, to the end
    assert fanout.promote(100, "default", clock=lambda: next(ticks)).promoted == 1
    assert Fanout.objects.get().status == "completed"


def test_cancelling_a_fan_outs_key_stops_the_fan_out_and_its_runs(api_a, tenant_a):
    define(api_a)
    setup_topic(api_a, members=[f"u{i}" for i in range(30)])
    body = trigger(api_a, {"topic": "outage", "cancellation_key": "storm"}).json()
    assert fanout.chunk_once(chunk=10) == 0
    response = api_a.post("/api/v1/workflows/notice/cancel", {"cancellation_key": "storm"}, format="json")
    assert response.status_code == 200, response.content
    assert fan_out_all(chunk=10) == 1  # the fan-out's job, ended without a chunk
    runs = WorkflowRun.objects.filter(trigger_id=body["trigger_id"])
    assert runs.count() == 10 and set(runs.values_list("status", flat=True)) == {"cancelled"}
    done = Fanout.objects.get()
    assert (done.status, done.created) == ("cancelled", 10) and done.finished_at is not None
    assert ScheduledJob.objects.get(kind="fanout").status == "cancelled"
    assert not ScheduledJob.objects.filter(status="pending").exists()
    assert Topic.objects.get().active_fanouts == 0
    assert api_a.delete("/api/v1/workflows/notice").status_code == 204  # nothing runs any more


def test_a_test_keys_cancel_never_stops_a_live_fan_out_and_the_reverse(api_a, tenant_a):
    """Runs and fan-outs belong to one mode: a cancel with the same cancellation key acts on its own."""
    test_api = client_for(ApiKey.issue(tenant_a, name="test", test=True)[1])
    define(api_a)
    setup_topic(api_a, members=[f"u{i:04d}" for i in range(30)])
    assert trigger(api_a, {"topic": "outage", "cancellation_key": "promo"}).status_code == 202
    assert trigger(test_api, {"topic": "outage", "cancellation_key": "promo"}).status_code == 202

    cancelled = test_api.post("/api/v1/workflows/notice/cancel", {"cancellation_key": "promo"}, format="json")
    assert cancelled.status_code == 200
    by_mode = dict(Fanout.objects.values_list("test", "status"))
    assert by_mode == {True: "cancelled", False: "running"}
    fan_out_all(chunk=10)
    assert WorkflowRun.objects.filter(test=False).count() == 30 and not WorkflowRun.objects.filter(test=True).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_workflow_delete_waits_for_a_trigger_in_flight_and_refuses_while_its_runs_are_unfinished(
    api_a, tenant_a
):
    """Runs have no database foreign key to their workflow: the delete and a trigger serialise on the
    workflow's row, so no run outlives its workflow."""
    define(api_a)
    workflow = Workflow.objects.get()
    triggering, release, outcome = threading.Event(), threading.Event(), []

    def trigger_in_flight() -> None:
        try:
            with transaction.atomic():
                services.trigger(tenant_a, "notice", subscribers=["a", "b"], data={}, cancellation_key=None,
                                 trigger_actor=None, actor="test")  # fmt: skip
                triggering.set()
                release.wait(30)
        finally:
            connections.close_all()

    def delete() -> None:
        try:
            services.delete_workflow(workflow, actor="test")
            outcome.append("deleted")
        except Conflict:
            outcome.append("refused")
        finally:
            connections.close_all()

    first = threading.Thread(target=trigger_in_flight)
    first.start()
    assert triggering.wait(10)
    deleting = threading.Thread(target=delete)
    deleting.start()
    deleting.join(0.5)
    assert deleting.is_alive() and outcome == []  # held by the trigger's transaction
    release.set()
    first.join(10)
    deleting.join(10)
    assert outcome == ["refused"]  # it saw the two runs the trigger committed
    assert Workflow.objects.filter(pk=workflow.pk).exists()
    assert WorkflowRun.objects.filter(workflow_id=workflow.pk).count() == 2


def test_a_share_renders_a_text_once_unless_it_reads_the_subscriber(api_a, tenant_a, monkeypatch):
    from notifications.models import Notification
    from templating import renderer
    from workflows import engine

    steps = [{"name": "tell", "type": "send", "channel": "in_app", "subject": "Outage {{ data.eta }}",
              "body": "Hello {{ subscriber.external_id }}, back in {{ data.eta }}"}]  # fmt: skip
    assert api_a.post("/api/v1/workflows", {"key": "named", "steps": steps}, format="json").status_code == 201
    setup_topic(api_a, members=[f"u{i:02d}" for i in range(20)])
    trigger(api_a, {"topic": "outage", "data": {"eta": "1h"}}, key="named")
    fan_out_all()
    renders: list[str] = []
    original = renderer.render

    def counted(text, context=None, **kwargs):  # noqa: ANN001, ANN003, ANN202
        renders.append(text)
        return original(text, context, **kwargs)

    monkeypatch.setattr(renderer, "render", counted)
    assert engine.promote_shares(100, "default").promoted == 20
    assert renders.count("Outage {{ data.eta }}") == 1  # the same for every run of the share
    assert renders.count(steps[0]["body"]) == 20  # it reads the subscriber: once a run
    assert set(Notification.objects.values_list("subject", flat=True)) == {"Outage 1h"}
    bodies = sorted(Notification.objects.values_list("body", flat=True))
    assert bodies == [f"Hello u{i:02d}, back in 1h" for i in range(20)]


def test_a_schedulers_shares_wait_while_a_fan_out_it_could_take_is_due(api_a, settings, monkeypatch):
    """One scheduler makes a broadcast's runs first, then its sends: while a fan-out is due and not
    held by a peer, the shares' turn passes; once it has ended, they go. A peer chunking it holds it:
    then the shares go (the test of two schedulers below)."""
    import itertools

    settings.OMNIPOST_FANOUT_CHUNK = 10
    monkeypatch.setattr(fanout, "budget", lambda last, now: 0.5)
    ticks = itertools.count(0.0, 0.2)  # the deadline's two readings, then one chunk before it passes

    def clock() -> float:
        return next(ticks)

    define(api_a)
    setup_topic(api_a, members=[f"u{i:02d}" for i in range(25)])
    body = trigger(api_a, {"topic": "outage"}).json()
    runs = WorkflowRun.objects.filter(trigger_id=body["trigger_id"])
    for made in (10, 20):
        fanout.promote(100, "default", clock=clock)
        assert runs.count() == made
        assert fanout.promote_shares(100, "default").promoted == 0  # the fan-out is still due
    fanout.promote(100, "default", clock=clock)  # its last chunk (5) ends it
    assert (Fanout.objects.get().status, runs.count()) == ("completed", 25)
    assert fanout.promote_shares(100, "default").promoted == 10  # one share a batch
    assert fanout.promote_shares(100, "default").promoted == 10
    assert fanout.promote_shares(100, "default").promoted == 5
    assert set(runs.values_list("status", flat=True)) == {"completed"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_peer_sends_the_shares_while_one_scheduler_holds_the_fan_out(api_a, settings):
    settings.OMNIPOST_FANOUT_CHUNK = 10
    define(api_a)
    setup_topic(api_a, members=[f"u{i:02d}" for i in range(25)])
    body = trigger(api_a, {"topic": "outage"}).json()
    assert fanout.chunk_once(chunk=10) == 0  # one share made, the fan-out still due
    assert fanout.promote_shares(100, "default").promoted == 0  # this scheduler would fan out first
    peer: list[int] = []

    def peer_scheduler() -> None:
        try:
            peer.append(fanout.promote_shares(100, "default").promoted)
        finally:
            connections.close_all()

    from queueing import scheduler

    with transaction.atomic():  # a scheduler mid-chunk, holding the fan-out's job
        with connection.cursor() as cursor:
            cursor.execute(scheduler.due_jobs_sql(fanout.JOB_KIND), {"n": 1})
            assert cursor.fetchone() is not None
        worker = threading.Thread(target=peer_scheduler)
        worker.start()
        worker.join(timeout=30)
    assert peer == [10]
    assert WorkflowRun.objects.filter(trigger_id=body["trigger_id"], status="completed").count() == 10


def test_a_share_whose_workflow_is_gone_fails_its_runs_and_lets_the_next_share_go(api_a, tenant_a):
    """Runs carry no foreign key to their workflow: a share of runs whose workflow vanished (a tenant
    deleted mid-chunk) must not come back at every turn in front of the others."""
    from workflows import engine

    define(api_a)
    define(api_a, key="other")
    setup_topic(api_a, members=[f"u{i}" for i in range(5)])
    gone = trigger(api_a, {"topic": "outage"}).json()
    fan_out_all()
    kept = trigger(api_a, {"topic": "outage"}, key="other").json()
    fan_out_all()
    WorkflowRun.objects.filter(trigger_id=gone["trigger_id"]).update(workflow_id=10**9)  # no such workflow
    assert engine.promote_shares(100, "default").promoted == 0  # the first share: its runs fail
    orphans = WorkflowRun.objects.filter(trigger_id=gone["trigger_id"])
    assert set(orphans.values_list("status", flat=True)) == {"failed"}
    assert engine.promote_shares(100, "default").promoted == 5  # the next share goes
    assert set(WorkflowRun.objects.filter(trigger_id=kept["trigger_id"]).values_list("status", flat=True)) == {
        "completed"}  # fmt: skip
    assert not ScheduledJob.objects.filter(kind="workflow_share", status="pending").exists()


def test_a_text_naming_subscriber_anywhere_is_rendered_run_by_run(api_a, tenant_a):
    """A loop variable called `subscriber` hides the real read from renderer.variables: the batch's
    render cache must not hand one member's text to the others."""
    from notifications.models import Notification
    from workflows import engine

    body = "{% for subscriber in data.vips %}{{ subscriber }} {% endfor %}Hi {{ subscriber.external_id }}"
    steps = [{"name": "tell", "type": "send", "channel": "in_app", "subject": "S", "body": body}]
    assert api_a.post("/api/v1/workflows", {"key": "loop", "steps": steps}, format="json").status_code == 201
    setup_topic(api_a, members=[f"u{i}" for i in range(5)])
    trigger(api_a, {"topic": "outage", "data": {"vips": ["boss"]}}, key="loop")
    fan_out_all()
    assert engine.promote_shares(100, "default").promoted == 5
    assert sorted(Notification.objects.values_list("body", flat=True)) == [f"boss Hi u{i}" for i in range(5)]
