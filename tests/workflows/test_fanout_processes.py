"""A topic fan-out under a real scheduler killed with SIGKILL midway: a second scheduler resumes from
the last committed chunk and every member at the trigger gets exactly one run (and one job)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.db import connection

from core.models import Tenant
from queueing.models import ScheduledJob
from recipients import topics
from tests.queueing.scheduler_support import start_scheduler, wait_for_text, wait_until
from workflows import services
from workflows.models import Fanout, Workflow, WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

MEMBERS = 30_000


def stop(proc) -> None:  # noqa: ANN001
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except Exception:  # noqa: BLE001
            proc.kill()
            proc.wait(timeout=10)


def test_a_fan_out_resumes_after_kill_9_with_each_member_once(tenant_a: Tenant, subprocess_env, tmp_path):
    # a delay step: the runs' own steps stay cheap, the scheduler's time goes to the fan-out
    Workflow.objects.create(tenant=tenant_a, key="notice", steps=[{"name": "wait", "type": "delay", "seconds": 3600}])
    topics.put_topic(tenant_a, "all", "All", actor="test")
    for start in range(0, MEMBERS, 1000):
        topics.add_members(tenant_a, "all", [f"u{i:06d}" for i in range(start, start + 1000)], actor="test")
    trigger_id, runs = services.trigger_topic(tenant_a, "notice", topic="all", data={"n": 1}, cancellation_key=None,
                                              trigger_actor="u000042", actor="test")  # fmt: skip
    assert runs == MEMBERS - 1
    topics.remove_members(tenant_a, "all", ["u000001", "u029999"], actor="test")  # after the 202: still reached
    env = {**subprocess_env, "OMNIPOST_FANOUT_CHUNK": "500", "OMNIPOST_FANOUT_BUDGET_SECONDS": "0.2"}
    first = start_scheduler(env, tmp_path / "s1.log", "--interval", "0.2")
    second = None
    try:
        wait_for_text(tmp_path / "s1.log", "scheduler ready", first)
        wait_until(lambda: Fanout.objects.get().created >= 5000, 120, "a third of the fan-out")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        midway = Fanout.objects.get()
        assert midway.status == "running" and 0 < midway.created < runs, midway.created
        time.sleep(0.5)
        assert Fanout.objects.get().created == midway.created  # nobody goes on while no scheduler runs
        second = start_scheduler(env, tmp_path / "s2.log", "--interval", "0.2")
        wait_until(lambda: Fanout.objects.get().status == "completed", 240, "the fan-out to finish")
    finally:
        stop(first)
        if second is not None:
            stop(second)
    made = WorkflowRun.objects.filter(trigger_id=trigger_id)
    assert made.count() == runs
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(DISTINCT subscriber), count(*) FILTER (WHERE subscriber = 'u000042') "
                       "FROM workflow_runs WHERE trigger_id = %s", [trigger_id])  # fmt: skip
        assert cursor.fetchone() == (runs, 0)
    assert made.filter(subscriber__in=["u000001", "u029999"]).count() == 2
    wakes = set(made.exclude(wake_id=None).values_list("wake_id", flat=True))
    jobs = ScheduledJob.objects.filter(kind__in=["workflow", "workflow_share"], notification_id__in=wakes)
    assert jobs.count() == len(wakes)  # one job per run waiting
    assert Fanout.objects.get().created == runs


def test_a_trigger_made_during_a_broadcast_is_advanced_before_the_broadcast_ends(
    tenant_a: Tenant, subprocess_env, tmp_path
):  # fmt: skip
    """A real scheduler sending a broadcast's in-app step share by share: a single trigger made meanwhile
    is advanced in its own turn, while most of the broadcast's runs still wait."""
    send = [{"name": "tell", "type": "send", "channel": "in_app", "subject": "Hi", "body": "{{ data.n }}"}]
    Workflow.objects.create(tenant=tenant_a, key="notice", steps=send)
    Workflow.objects.create(tenant=tenant_a, key="reset", steps=send)
    members = 20_000
    topics.put_topic(tenant_a, "all", "All", actor="test")
    for start in range(0, members, 1000):
        topics.add_members(tenant_a, "all", [f"u{i:06d}" for i in range(start, start + 1000)], actor="test")
    broadcast, _ = services.trigger_topic(tenant_a, "notice", topic="all", data={"n": 1}, cancellation_key=None,
                                          trigger_actor=None, actor="test")  # fmt: skip
    proc = start_scheduler(subprocess_env, tmp_path / "s.log", "--interval", "0.2")
    try:
        wait_for_text(tmp_path / "s.log", "scheduler ready", proc)
        runs = WorkflowRun.objects.filter(trigger_id=broadcast)
        wait_until(lambda: runs.filter(status="completed").count() >= 1000, 120, "the broadcast's first shares")
        single, _ = services.trigger(tenant_a, "reset", subscribers=["solo"], data={"n": 2}, cancellation_key=None,
                                     trigger_actor=None, actor="test")  # fmt: skip
        alone = WorkflowRun.objects.filter(trigger_id=single)
        wait_until(lambda: alone.filter(status="completed").exists(), 60, "the single trigger's run")
        waiting = runs.exclude(status="completed").count()
        wait_until(lambda: not runs.exclude(status="completed").exists(), 240, "the broadcast's end")
    finally:
        stop(proc)
    assert waiting > members // 2, waiting  # the single run did not wait for the broadcast
    assert runs.count() == members and alone.count() == 1
