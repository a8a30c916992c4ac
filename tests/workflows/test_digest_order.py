"""A digest's items are its triggers' data oldest first, whatever order schedulers working in parallel
bring the runs to the step: a trigger that reaches the step after a later one did joins the window that
one opened, goes in front of it, and moves the window's opening back to its own time; past 100 items the
oldest 100 are kept."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from workflows import services, statements
from workflows.models import Workflow, WorkflowDigest, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

STEP = {"name": "collect", "type": "digest", "window_seconds": 300}


def runs(api, tenant, count: int) -> list[WorkflowRun]:  # noqa: ANN001
    steps = [STEP, {"name": "tell", "type": "send", "channel": "in_app", "subject": "s", "body": "b"}]
    assert api.post("/api/v1/workflows", {"key": "comments", "steps": steps}, format="json").status_code == 201
    workflow = Workflow.objects.get()
    for n in range(count):
        services.trigger(tenant, workflow.key, subscribers=["jane"], data={"n": n}, cancellation_key=None,
                         trigger_actor=None, actor="test")  # fmt: skip
    made = sorted(WorkflowRun.objects.all(), key=lambda run: (run.created_at, run.data["n"]))
    assert [run.data["n"] for run in made] == list(range(count))
    return made


def test_an_earlier_trigger_reaching_the_step_late_goes_first(api_a, tenant_a):
    first, second, third = runs(api_a, tenant_a, 3)
    assert statements.join_digest(third, STEP, timezone.now()) is not None  # the latest trigger opens and leads
    assert statements.join_digest(first, STEP, timezone.now()) is None
    assert statements.join_digest(second, STEP, timezone.now()) is None
    window = WorkflowDigest.objects.get()
    # opened at the first trigger's time; it ends when its leader's wait does
    assert window.opened_at == first.created_at
    assert window.closes_at == third.created_at + timedelta(seconds=STEP["window_seconds"])
    assert statements.close_digest(third, "collect") == {"count": 3, "items": [{"n": 0}, {"n": 1}, {"n": 2}]}


def test_an_item_the_version_before_wrote_without_a_time_keeps_its_place(api_a, tenant_a):
    """It takes the time of the item before it (the version before appended in join order)."""
    first, second, third = runs(api_a, tenant_a, 3)
    assert statements.join_digest(second, STEP, timezone.now()) is not None
    # the version before joins as it did: the data appended, no trigger time
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workflow_digests SET count = count + 1, items = items || %s::jsonb",
                       ['[{"n": "old"}]'])  # fmt: skip
    assert statements.join_digest(first, STEP, timezone.now()) is None
    assert statements.join_digest(third, STEP, timezone.now()) is None
    digest = statements.close_digest(second, "collect")
    assert digest == {"count": 4, "items": [{"n": 0}, {"n": 1}, {"n": "old"}, {"n": 2}]}


def test_past_a_hundred_items_the_oldest_hundred_are_kept(api_a, tenant_a):
    made = runs(api_a, tenant_a, 103)
    newest, *older = reversed(made)  # the newest opens the window, then the others, newest first
    assert statements.join_digest(newest, STEP, timezone.now()) is not None
    for run in older:
        assert statements.join_digest(run, STEP, timezone.now()) is None
    digest = statements.close_digest(newest, "collect")
    assert digest["count"] == 103 and digest["items"] == [{"n": n} for n in range(100)]


def test_joins_in_order_append(api_a, tenant_a):
    leader, *others = runs(api_a, tenant_a, 102)
    assert statements.join_digest(leader, STEP, timezone.now()) is not None
    for run in others:
        assert statements.join_digest(run, STEP, timezone.now()) is None
    digest = statements.close_digest(leader, "collect")
    assert digest["count"] == 102 and digest["items"] == [{"n": n} for n in range(100)]


def test_a_window_the_version_before_opened_keeps_its_first_item_first(api_a, tenant_a):
    """The version before opens without trigger times (the column's default): its item counts as
    opened at the window's opening, before any later trigger."""
    first, second = runs(api_a, tenant_a, 2)
    with connection.cursor() as cursor:  # the version before's open: no item_stamps
        cursor.execute(
            "INSERT INTO workflow_digests (tenant_id, workflow_id, step, subscriber, key, status, opened_at, "
            "closes_at, leader_id, count, items) VALUES (%s, %s, 'collect', %s, '', 'open', %s, %s, %s, 1, %s)",
            [first.tenant_id, first.workflow_id, first.subscriber, first.created_at,
             first.created_at + timedelta(seconds=300), first.pk, '[{"n": 0}]'],
        )  # fmt: skip
    assert statements.join_digest(second, STEP, timezone.now()) is None
    assert statements.close_digest(first, "collect") == {"count": 2, "items": [{"n": 0}, {"n": 1}]}
