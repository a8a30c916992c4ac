"""`until_local` delays: the next "HH:MM" in the subscriber's zone, across DST changes, from an injected
clock (the pure rule, and the engine reaching a delay step at a given instant)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from queueing.models import ScheduledJob
from workflows import engine
from workflows.models import WorkflowRun
from workflows.steps import delay_until

NINE = {"name": "morning", "type": "delay", "until_local": "09:00"}


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("zone", "now", "expected"),
    [
        # New York falls back on 2026-11-01 (02:00 EDT → 01:00 EST): 09:00 is 13:00 UTC before, 14:00 after
        ("America/New_York", utc(2026, 10, 31, 12, 0), utc(2026, 10, 31, 13, 0)),  # Sat 08:00 EDT: today
        ("America/New_York", utc(2026, 10, 31, 14, 0), utc(2026, 11, 1, 14, 0)),  # Sat 10:00 EDT: Sunday, EST
        ("America/New_York", utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 14, 0)),  # in the repeated hour
        # Auckland springs forward on 2026-09-27 (02:00 NZST → 03:00 NZDT): 09:00 is 21:00 UTC, then 20:00
        ("Pacific/Auckland", utc(2026, 9, 26, 10, 0), utc(2026, 9, 26, 20, 0)),  # Sat 22:00 NZST: Sunday, NZDT
        ("Pacific/Auckland", utc(2026, 9, 25, 10, 0), utc(2026, 9, 25, 21, 0)),  # Fri 22:00 NZST: Saturday, NZST
        ("Pacific/Auckland", utc(2027, 4, 3, 10, 0), utc(2027, 4, 3, 21, 0)),  # falls back 2027-04-04: NZST
        ("", utc(2026, 9, 26, 9, 0), utc(2026, 9, 27, 9, 0)),  # no zone: UTC; exactly 09:00 is the next day's
    ],
)
def test_until_local_is_the_next_wall_clock_time_in_the_subscribers_zone(zone, now, expected):
    assert delay_until(NINE, zone, now) == expected


def test_a_time_the_clock_skips_is_the_first_instant_after_the_gap():
    step = {**NINE, "until_local": "02:30"}
    # Auckland, 2026-09-27 00:00 NZST: 02:30 does not exist that night; 03:00 NZDT = 14:00 UTC
    assert delay_until(step, "Pacific/Auckland", utc(2026, 9, 26, 12, 0)) == utc(2026, 9, 26, 14, 0)


@pytest.mark.django_db
def test_the_engine_waits_until_the_subscribers_morning_from_the_clock_it_is_given(api_a, tenant_a):
    for external_id, zone in (("kiwi", "Pacific/Auckland"), ("nyc", "America/New_York")):
        assert api_a.put(f"/api/v1/subscribers/{external_id}", {"timezone": zone}, format="json").status_code == 201
    made = api_a.post("/api/v1/workflows", {"key": "morning", "steps": [NINE]}, format="json")
    assert made.status_code == 201, made.content
    api_a.post("/api/v1/workflows/morning/trigger", {"subscribers": ["kiwi", "nyc"]}, format="json")
    now = utc(2026, 10, 31, 14, 0)  # Auckland Sunday 03:00 NZDT; New York Saturday 10:00 EDT, the day before fall-back
    for run in WorkflowRun.objects.select_related("tenant", "workflow"):
        engine.advance(run, now)
    at = {r.subscriber: r.steps[0]["at"] for r in WorkflowRun.objects.all()}
    assert at == {"kiwi": utc(2026, 10, 31, 20, 0).isoformat(), "nyc": utc(2026, 11, 1, 14, 0).isoformat()}
    wakes = WorkflowRun.objects.values_list("wake_id", flat=True)
    waits = sorted(ScheduledJob.objects.filter(notification_id__in=wakes).values_list("run_at", flat=True))
    assert waits == [utc(2026, 10, 31, 20, 0), utc(2026, 11, 1, 14, 0)]
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"waiting"}
