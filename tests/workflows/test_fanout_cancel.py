"""Cancelling a workflow's runs while, and after, a topic fan-out makes them: a named member the
fan-out has not reached yet gets a `cancelled` run and never a send, the others theirs, with exact
counts; a cancel racing a chunk in flight (threads, bounded); a cancel's statements do not grow with
its runs (set-based chunks, the notifications they scheduled included)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.models import AuditEvent
from notifications.models import Notification
from queueing.models import ScheduledJob
from recipients.models import Subscriber
from tests import factories
from tests.workflows.test_fanout import define, fan_out_all, setup_topic, trigger
from workflows import engine, fanout, services
from workflows.models import Fanout, FanoutCancel, WorkflowRun, resolve_runs

pytestmark = pytest.mark.django_db

MEMBERS = [f"u{i:02d}" for i in range(25)]


def cancel(api, body, key="notice"):  # noqa: ANN001, ANN201
    response = api.post(f"/api/v1/workflows/{key}/cancel", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["cancelled"]


def run_engine() -> None:
    while engine.promote_shares(100, "default").promoted or engine.promote(100, "default").promoted:
        pass


def statuses(trigger_id) -> dict[str, str]:  # noqa: ANN001
    return dict(WorkflowRun.objects.filter(trigger_id=trigger_id).values_list("subscriber", "status"))


def test_a_named_member_not_fanned_out_yet_gets_a_cancelled_run_and_no_send(api_a, tenant_a):
    define(api_a)
    setup_topic(api_a, members=MEMBERS)
    body = trigger(api_a, {"topic": "outage", "cancellation_key": "k", "actor": "u20"}).json()
    assert body["runs"] == 24
    assert fanout.chunk_once(chunk=10) == 0  # u00..u09 have runs, the rest not yet
    # u03 has a run; u15 and u22 have none yet; u20 is the actor (never a run); "ghost" is no member
    named = ["u03", "u15", "u22", "u20", "ghost", "u15"]
    assert cancel(api_a, {"cancellation_key": "k", "subscribers": named}) == 3
    assert cancel(api_a, {"cancellation_key": "k", "subscribers": named}) == 0  # a repeat
    assert fan_out_all(chunk=10) == 2
    runs = statuses(body["trigger_id"])
    assert len(runs) == 24 and "u20" not in runs  # exactly one run per member at the trigger
    assert {s for s, status in runs.items() if status == "cancelled"} == {"u03", "u15", "u22"}
    done = Fanout.objects.get()
    assert (done.status, done.created, done.total) == ("completed", 24, 24)
    ahead = WorkflowRun.objects.get(trigger_id=body["trigger_id"], subscriber="u22")
    assert (ahead.wake_id, ahead.steps, ahead.cancellation_key) == (None, None, "k")
    run_engine()
    runs = statuses(body["trigger_id"])
    assert sorted(s for s, status in runs.items() if status == "completed") == sorted(
        set(MEMBERS) - {"u03", "u15", "u20", "u22"})  # fmt: skip
    sent = {n.recipient for n in Notification.objects.for_tenant(tenant_a)}
    assert len(sent) == 21 and not sent & {"u03", "u15", "u20", "u22"}
    assert not ScheduledJob.objects.filter(kind="workflow_share", status="pending").exists()
    listed = api_a.get(f"/api/v1/workflow-runs?trigger_id={body['trigger_id']}&subscriber=u15").json()["results"]
    assert [(r["status"], [(s["status"], s["notification_id"]) for s in r["steps"]]) for r in listed] == [
        ("cancelled", [("pending", None)])]  # fmt: skip
    audit = AuditEvent.objects.get(action="workflow.cancelled")
    assert audit.details == {"cancellation_key": "k", "runs": 3}


def test_a_member_removed_after_the_trigger_still_gets_a_cancelled_run_and_other_keys_run_on(api_a):
    define(api_a)
    setup_topic(api_a, members=MEMBERS)
    body = trigger(api_a, {"topic": "outage", "cancellation_key": "k"}).json()
    other = trigger(api_a, {"topic": "outage", "cancellation_key": "other"}).json()
    removed = api_a.delete("/api/v1/topics/outage/subscribers", {"subscribers": ["u24"]}, format="json")
    assert removed.json() == {"removed": 1}
    # both will have a cancelled run; only the live member is counted (no index finds a removed one)
    assert cancel(api_a, {"cancellation_key": "k", "subscribers": ["u24", "u01"]}) == 1
    assert FanoutCancel.objects.filter(fanout_id=other["trigger_id"]).count() == 0
    fan_out_all()
    assert statuses(body["trigger_id"])["u24"] == statuses(body["trigger_id"])["u01"] == "cancelled"
    assert list(statuses(body["trigger_id"]).values()).count("cancelled") == 2
    assert set(statuses(other["trigger_id"]).values()) == {"running"}
    assert len(statuses(other["trigger_id"])) == 25


def test_a_cancel_of_every_run_stops_the_fan_out_and_counts_the_runs_made(api_a):
    define(api_a)
    setup_topic(api_a, members=MEMBERS)
    body = trigger(api_a, {"topic": "outage", "cancellation_key": "k"}).json()
    assert fanout.chunk_once(chunk=10) == 0
    assert cancel(api_a, {"cancellation_key": "k", "subscribers": ["u02", "u12"]}) == 2
    assert cancel(api_a, {"cancellation_key": "k"}) == 9  # u02's run was stopped already; u12 has none yet
    assert fan_out_all() == 1  # the fan-out's job, settled
    assert set(statuses(body["trigger_id"]).values()) == {"cancelled"} and len(statuses(body["trigger_id"])) == 10
    assert Fanout.objects.get().status == "cancelled"


def test_a_cancel_in_chunks_stops_every_run_once_and_cancels_each_shared_job_with_its_last_run(
    api_a, tenant_a, monkeypatch
):  # fmt: skip
    monkeypatch.setattr(services, "CANCEL_CHUNK", 7)
    define(api_a)
    setup_topic(api_a, members=MEMBERS)
    body = trigger(api_a, {"topic": "outage", "cancellation_key": "k"}).json()
    fan_out_all()
    keep = trigger(api_a, {"topic": "outage", "cancellation_key": "keep"}).json()
    fan_out_all()
    assert ScheduledJob.objects.filter(kind="workflow_share", status="pending").count() == 2  # one per fan-out
    with CaptureQueriesContext(connection) as queries:
        assert services.cancel(tenant_a, "notice", "k", subscribers=None, actor="t") == 25  # 7, 7, 7 and 4
    # the workflow, its fan-outs (3), 4 a chunk (a savepoint, the pick, the runs, its release: no
    # notification to cancel), the audit row
    assert len(queries.captured_queries) == 1 + 3 + 4 * 4 + 1, [q["sql"][:60] for q in queries.captured_queries]
    assert set(statuses(body["trigger_id"]).values()) == {"cancelled"}
    assert set(statuses(keep["trigger_id"]).values()) == {"running"}
    jobs = ScheduledJob.objects.filter(kind="workflow_share").values_list("notification_id", "status")
    wakes = {run.wake_id for run in WorkflowRun.objects.filter(trigger_id=keep["trigger_id"])}
    assert sorted(status for _, status in jobs) == ["cancelled", "pending"]
    assert {opaque for opaque, status in jobs if status == "pending"} == wakes
    assert cancel(api_a, {"cancellation_key": "k"}) == 0


def test_a_chunk_undone_after_a_cancel_named_a_member_makes_its_run_cancelled_when_repeated(api_a):
    define(api_a)
    setup_topic(api_a, members=MEMBERS)
    body = trigger(api_a, {"topic": "outage", "cancellation_key": "k"}).json()
    assert cancel(api_a, {"cancellation_key": "k", "subscribers": ["u05"]}) == 1
    with pytest.raises(RuntimeError), transaction.atomic():  # a scheduler killed before its chunk commits
        fanout.chunk_once(chunk=10)
        assert statuses(body["trigger_id"])["u05"] == "cancelled"
        raise RuntimeError("killed")
    assert statuses(body["trigger_id"]) == {} and Fanout.objects.get().cursor == 0
    fan_out_all(chunk=10)
    runs = statuses(body["trigger_id"])
    assert len(runs) == 25 and [s for s, status in runs.items() if status == "cancelled"] == ["u05"]


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


@pytest.mark.django_db(transaction=True)
def test_a_cancel_racing_a_chunk_in_flight_waits_for_it_and_reaches_the_members_after_it(api_a, tenant_a):
    """A chunk holds its fan-out's row while a cancel names a member it is making and one after it: the
    cancel waits, then stops the first's run and records the second (the next chunk makes it cancelled)."""
    define(api_a)
    setup_topic(api_a, members=MEMBERS)
    trigger_id = trigger(api_a, {"topic": "outage", "cancellation_key": "k"}).json()["trigger_id"]
    in_chunk, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def chunk() -> None:
        try:
            with transaction.atomic():
                outcome["chunk"] = fanout.chunk_once(chunk=10)  # u00..u09, held until released
                in_chunk.set()
                release.wait(20)
        finally:
            connections.close_all()

    def cancelling() -> None:
        try:
            outcome["cancelled"] = services.cancel(tenant_a, "notice", "k", subscribers=["u05", "u15"], actor="t")
        finally:
            connections.close_all()

    maker = threading.Thread(target=chunk)
    maker.start()
    assert in_chunk.wait(20)
    canceller = threading.Thread(target=cancelling)
    canceller.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _waiting_on_a_lock():
        time.sleep(0.02)
    assert _waiting_on_a_lock()  # the cancel waits for the chunk's fan-out row
    assert "cancelled" not in outcome
    release.set()
    maker.join(20)
    canceller.join(20)
    assert not maker.is_alive() and not canceller.is_alive()
    assert outcome == {"chunk": 0, "cancelled": 2}
    fan_out_all(chunk=10)
    runs = statuses(trigger_id)
    assert len(runs) == 25
    assert {s for s, status in runs.items() if status == "cancelled"} == {"u05", "u15"}


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND wait_event_type = 'Lock'")  # fmt: skip
        return cursor.fetchone()[0] > 0
