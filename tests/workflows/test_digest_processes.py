"""Digests under real processes: two schedulers and two dispatchers, one of each killed with SIGKILL while
the window is open and the survivors' database sessions terminated once. Every trigger is counted once,
and each window ends in exactly one notification."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest
from django.db import connection
from django.db.models.functions import Now

from inbox.models import InboxItem
from notifications.models import Notification
from queueing.models import ScheduledJob
from tests.queueing.dispatch_support import start_dispatchers, wait_started
from tests.queueing.scheduler_support import start_scheduler, wait_for_text, wait_until
from tests.support.web import stop_all
from workflows import services
from workflows.models import Workflow, WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

WINDOW = 300.0  # seconds; the tests end it early (time_passes) once every join has happened


def define(api) -> None:  # noqa: ANN001
    steps = [{"name": "collect", "type": "digest", "window_seconds": WINDOW},
             {"name": "tell", "type": "send", "channel": "in_app", "subject": "{{ digest.count }}",
              "body": "{{ digest.items|length }} items, first {{ digest.items.0.n }}"}]  # fmt: skip
    assert api.post("/api/v1/workflows", {"key": "comments", "steps": steps}, format="json").status_code == 201


def terminate_sessions(prefix: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE %s",
                       [f"{prefix}%"])  # fmt: skip
        return cursor.fetchone()[0]


def digested(count: int):  # noqa: ANN201
    return lambda: WorkflowRun.objects.filter(status="digested").count() == count


def time_passes() -> None:
    """The open windows' time is up (their leaders' jobs become due by the database's clock)."""
    assert ScheduledJob.objects.filter(kind="workflow", status="pending").update(run_at=Now()) > 0


def finished() -> bool:
    return not WorkflowRun.objects.unfinished().exists() and not ScheduledJob.objects.filter(status="pending").exists()



def test_a_thousand_triggers_make_one_digest_while_processes_die(api_a, tenant_a, subprocess_env, tmp_path):
    define(api_a)
    workflow = Workflow.objects.get()
    logs = tmp_path / "logs"
    logs.mkdir()
    schedulers = [start_scheduler(subprocess_env, logs / f"s{i}.log", "--interval", "0.2") for i in range(2)]
    dispatchers = start_dispatchers(2, subprocess_env, "--batch-size", "20", log_dir=logs)
    procs = [*schedulers, *dispatchers]
    try:
        for i, proc in enumerate(schedulers):
            wait_for_text(logs / f"s{i}.log", "scheduler ready", proc)
        assert wait_started(logs, 2)
        started = time.monotonic()
        for n in range(1000):
            services.trigger(tenant_a, workflow.key, subscribers=["jane"], data={"n": n}, cancellation_key=None,
                             trigger_actor=None, actor="test")  # fmt: skip
            if n == 300:
                os.kill(schedulers[0].pid, signal.SIGKILL)
                os.kill(dispatchers[0].pid, signal.SIGKILL)
            if n == 600:
                assert terminate_sessions("omnipost-scheduler-") > 0
        triggering = time.monotonic() - started
        assert triggering < WINDOW, f"the triggers took {triggering:.1f}s, longer than the window"
        wait_until(digested(999), 120, "every trigger but the first to join the window")
        time_passes()
        wait_until(finished, 60, "every run to finish")
        wait_until(lambda: Notification.objects.filter(status="delivered").exists(), 60, "the digest's delivery")
    finally:
        stop_all(procs)
    assert Counter(WorkflowRun.objects.values_list("status", flat=True)) == {"digested": 999, "completed": 1}
    (note,) = Notification.objects.all()
    assert note.subject == "1000" and note.body == "100 items, first 0"
    assert note.status == "delivered" and InboxItem.objects.count() == 1
    # the first run to reach the step leads (schedulers in parallel may bring a later trigger first)
    leader = WorkflowRun.objects.get(status="completed")
    assert leader.steps[1]["notification_id"] == str(note.pk)


def test_a_hundred_subscribers_times_fifty_triggers_make_a_hundred_digests(api_a, tenant_a, subprocess_env, tmp_path):
    define(api_a)
    workflow = Workflow.objects.get()
    logs = tmp_path / "logs"
    logs.mkdir()
    schedulers = [start_scheduler(subprocess_env, logs / f"s{i}.log", "--interval", "0.2") for i in range(2)]
    try:
        for i, proc in enumerate(schedulers):
            wait_for_text(logs / f"s{i}.log", "scheduler ready", proc)
        people = [f"user-{i}" for i in range(100)]
        for n in range(50):
            services.trigger(tenant_a, workflow.key, subscribers=people, data={"n": n}, cancellation_key=None,
                             trigger_actor=None, actor="test")  # fmt: skip
        wait_until(digested(4900), 180, "every trigger but each subscriber's first to join a window")
        time_passes()
        wait_until(finished, 60, "every run to finish")
    finally:
        stop_all(schedulers)
    notes = list(Notification.objects.values_list("subscriber", "subject"))
    assert len(notes) == 100
    assert sorted(notes) == sorted((person, "50") for person in people)
    assert Counter(WorkflowRun.objects.values_list("status", flat=True)) == {"digested": 4900, "completed": 100}


def test_a_throttle_under_two_schedulers_lets_exactly_its_limit_through(api_a, tenant_a, subprocess_env, tmp_path):
    steps = [{"name": "cap", "type": "throttle", "limit": 3, "window_seconds": 600},
             {"name": "tell", "type": "send", "channel": "in_app", "body": "{{ data.n }}"}]  # fmt: skip
    assert api_a.post("/api/v1/workflows", {"key": "capped", "steps": steps}, format="json").status_code == 201
    logs = tmp_path / "logs"
    logs.mkdir()
    schedulers = [start_scheduler(subprocess_env, logs / f"s{i}.log", "--interval", "0.2") for i in range(2)]
    try:
        for i, proc in enumerate(schedulers):
            wait_for_text(logs / f"s{i}.log", "scheduler ready", proc)
        for n in range(10):
            services.trigger(tenant_a, "capped", subscribers=["jane", "joe"], data={"n": n}, cancellation_key=None,
                             trigger_actor=None, actor="test")  # fmt: skip
        wait_until(finished, 60, "every run to finish")
    finally:
        stop_all(schedulers)
    by_person = Counter(WorkflowRun.objects.values_list("subscriber", "status"))
    assert by_person == {("jane", "completed"): 3, ("jane", "throttled"): 7, ("joe", "completed"): 3,
                         ("joe", "throttled"): 7}  # fmt: skip
    assert Counter(Notification.objects.values_list("subscriber", flat=True)) == {"jane": 3, "joe": 3}


def test_each_send_step_runs_once_when_a_scheduler_is_killed_mid_batch(api_a, tenant_a, subprocess_env, tmp_path):
    steps = [{"name": "one", "type": "send", "channel": "in_app", "body": "1"},
             {"name": "two", "type": "send", "channel": "in_app", "body": "2"}]  # fmt: skip
    assert api_a.post("/api/v1/workflows", {"key": "twice", "steps": steps}, format="json").status_code == 201
    services.trigger(tenant_a, "twice", subscribers=[f"u{i}" for i in range(400)], data={}, cancellation_key=None,
                     trigger_actor=None, actor="test")  # fmt: skip
    logs = tmp_path / "logs"
    logs.mkdir()
    first = start_scheduler(subprocess_env, logs / "s0.log", "--interval", "0.2")
    try:
        wait_until(lambda: Notification.objects.exists(), 60, "the first batch to commit")
        os.kill(first.pid, signal.SIGKILL)  # mid-way: its open batch rolls back, its jobs are pending again
        first.wait(timeout=10)
        survivor = start_scheduler(subprocess_env, logs / "s1.log", "--interval", "0.2")
        wait_until(finished, 120, "every run to finish")
    finally:
        stop_all([first, survivor] if "survivor" in locals() else [first])
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"completed"}
    per_run = Counter(Notification.objects.values_list("metadata__workflow_run_id", "metadata__step"))
    assert len(per_run) == 800 and set(per_run.values()) == {1}
    linked = {s["notification_id"] for run in WorkflowRun.objects.all() for s in run.steps}
    assert linked == {str(pk) for pk in Notification.objects.values_list("pk", flat=True)}
