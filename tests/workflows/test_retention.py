"""`prune` deletes finished workflow runs past retention, with the closed digest windows and the
throttle counters nobody needs any more; unfinished runs, and what they still lead, stay."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from workflows.models import FINISHED, UNFINISHED, Workflow, WorkflowDigest, WorkflowRun, WorkflowThrottle

pytestmark = pytest.mark.django_db

OLD = timezone.now() - timedelta(days=40)


def test_finished_runs_past_retention_go_with_their_closed_windows(tenant_a):
    workflow = Workflow.objects.create(tenant=tenant_a, key="w", steps=[{"name": "s", "type": "delay", "seconds": 1}])

    def run(status: str, *, old: bool) -> uuid.UUID:
        made = WorkflowRun.objects.create(tenant=tenant_a, workflow=workflow, subscriber="jane",
                                          trigger_id=uuid.uuid4(), status=status)  # fmt: skip
        if old:
            WorkflowRun.objects.filter(pk=made.pk).update(updated_at=OLD)
        return made.pk

    old_finished = [run(status, old=True) for status in FINISHED]
    old_unfinished = [run(status, old=True) for status in UNFINISHED]  # a delay of months: it stays
    new_finished = [run(status, old=False) for status in FINISHED]

    def window(status: str, closes_at, leader: uuid.UUID) -> int:  # noqa: ANN001
        return WorkflowDigest.objects.create(
            tenant=tenant_a, workflow=workflow, step="d", subscriber=str(uuid.uuid4()), status=status,
            opened_at=closes_at - timedelta(seconds=5), closes_at=closes_at, leader_id=leader, count=1,
        ).pk  # fmt: skip

    gone_window = window("closed", OLD, old_finished[0])
    led_window = window("closed", OLD, old_unfinished[0])  # its leader still waits: it reads the window
    open_window = window("open", OLD, uuid.uuid4())
    new_window = window("closed", timezone.now(), new_finished[0])

    def throttle(start) -> int:  # noqa: ANN001
        subscriber = str(uuid.uuid4())
        return WorkflowThrottle.objects.create(
            tenant=tenant_a, workflow=workflow, step="t", subscriber=subscriber, window_start=start, count=3
        ).pk

    # a 31-day window (the longest a step may have) that began 30.5 days ago may still be counting
    recent = timezone.now() - timedelta(days=30.5)
    ancient_throttle, old_throttle, new_throttle = throttle(OLD), throttle(recent), throttle(timezone.now())

    dry = io.StringIO()
    call_command("prune", "--older-than", "30", "--dry-run", stdout=dry)
    summary = f"{len(FINISHED)} finished workflow run(s), 1 closed digest window(s), 1 throttle window(s)"
    assert summary in dry.getvalue()
    assert WorkflowRun.objects.count() == 2 * len(FINISHED) + len(UNFINISHED)

    out = io.StringIO()
    call_command("prune", "--older-than", "30", stdout=out, stderr=io.StringIO())
    assert summary in out.getvalue()
    assert set(WorkflowRun.objects.values_list("pk", flat=True)) == {*old_unfinished, *new_finished}
    assert set(WorkflowDigest.objects.values_list("pk", flat=True)) == {led_window, open_window, new_window}
    assert gone_window not in set(WorkflowDigest.objects.values_list("pk", flat=True))
    assert set(WorkflowThrottle.objects.values_list("pk", flat=True)) == {old_throttle, new_throttle}
    assert not WorkflowThrottle.objects.filter(pk=ancient_throttle).exists()

    again = io.StringIO()
    call_command("prune", "--older-than", "30", stdout=again, stderr=io.StringIO())
    assert "0 finished workflow run(s), 0 closed digest window(s), 0 throttle window(s)" in again.getvalue()
