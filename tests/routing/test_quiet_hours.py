"""Quiet hours: a non-critical notification created inside its category's
window (or general's, the tenant default), in the subscriber's time zone (UTC without one), is
created `scheduled` for the window's end, DST-correct; the policy's table, then the API (single,
batch, the hot path; statements counted), then one end-to-end run with real scheduler and
dispatcher processes releasing a held notification to a real receiver."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from notifications import tenant_config
from notifications.api import views
from notifications.models import Notification
from queueing.models import ScheduledJob
from recipients.models import Category
from routing import quiet_hours
from templating.models import Template
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.queueing.scheduler_support import start_scheduler, wait_for_text
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver
from tests.support.setups import email
from workflows import sequences
from workflows.sequences import StepSpec

URL = "/api/v1/notifications"
BERLIN, NEW_YORK = "Europe/Berlin", "America/New_York"
NIGHT = {"start": "22:00", "end": "07:00"}


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# --- the policy -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "window", "created", "released"),
    [
        # 23:00 local → 07:00 local the next morning (summer in Berlin: UTC+2)
        (BERLIN, NIGHT, "2025-06-10T21:00", "2025-06-11T05:00"),
        (BERLIN, NIGHT, "2025-06-10T20:00", "2025-06-11T05:00"),  # 22:00: `start` is inside
        (BERLIN, NIGHT, "2025-06-11T04:59", "2025-06-11T05:00"),  # 06:59
        (BERLIN, NIGHT, "2025-06-11T05:00", None),  # 07:00: `end` is not
        (BERLIN, NIGHT, "2025-06-10T19:59", None),  # 21:59
        (BERLIN, NIGHT, "2025-06-10T12:00", None),
        # Berlin springs forward on 2025-03-30 at 02:00 CET (01:00 UTC): the night is an hour shorter
        (BERLIN, NIGHT, "2025-03-29T21:00", "2025-03-30T05:00"),  # 22:00 CET → 07:00 CEST
        (BERLIN, NIGHT, "2025-03-29T22:00", "2025-03-30T05:00"),  # 23:00 CET
        (BERLIN, NIGHT, "2025-03-30T00:30", "2025-03-30T05:00"),  # 01:30 CET, before the jump
        (BERLIN, NIGHT, "2025-03-30T01:00", "2025-03-30T05:00"),  # 03:00 CEST, just after it
        # … and falls back on 2025-10-26 at 03:00 CEST (01:00 UTC): an hour longer
        (BERLIN, NIGHT, "2025-10-25T20:00", "2025-10-26T06:00"),  # 22:00 CEST → 07:00 CET
        (BERLIN, NIGHT, "2025-10-25T21:00", "2025-10-26T06:00"),  # 23:00 CEST
        (BERLIN, NIGHT, "2025-10-26T00:30", "2025-10-26T06:00"),  # 02:30 CEST, the first time
        (BERLIN, NIGHT, "2025-10-26T01:30", "2025-10-26T06:00"),  # 02:30 CET, the second time
        # New York springs forward on 2025-03-09 at 02:00 EST (07:00 UTC) and falls back on
        # 2025-11-02 at 02:00 EDT (06:00 UTC)
        (NEW_YORK, NIGHT, "2025-03-09T03:00", "2025-03-09T11:00"),  # 22:00 EST → 07:00 EDT
        (NEW_YORK, NIGHT, "2025-03-09T04:00", "2025-03-09T11:00"),  # 23:00 EST
        (NEW_YORK, NIGHT, "2025-03-09T06:59", "2025-03-09T11:00"),  # 01:59 EST
        (NEW_YORK, NIGHT, "2025-11-02T02:00", "2025-11-02T12:00"),  # 22:00 EDT → 07:00 EST
        (NEW_YORK, NIGHT, "2025-11-02T03:00", "2025-11-02T12:00"),  # 23:00 EDT
        (NEW_YORK, NIGHT, "2025-11-02T06:30", "2025-11-02T12:00"),  # 01:30 EST, the second time
        # an end the clock skips is the first instant after the gap
        (BERLIN, {"start": "22:00", "end": "02:30"}, "2025-03-29T22:00", "2025-03-30T01:00"),  # → 03:00 CEST
        (BERLIN, {"start": "22:00", "end": "02:00"}, "2025-03-29T22:00", "2025-03-30T01:00"),
        (NEW_YORK, {"start": "22:00", "end": "02:30"}, "2025-03-09T04:00", "2025-03-09T07:00"),  # → 03:00 EDT
        # Lord Howe Island skips half an hour (02:00 → 02:30, UTC+10:30 → +11) on 2025-10-05
        ("Australia/Lord_Howe", {"start": "22:00", "end": "02:15"}, "2025-10-04T12:00", "2025-10-04T15:30"),
        # an end the clock shows twice is its first showing after creation
        (NEW_YORK, {"start": "22:00", "end": "01:30"}, "2025-11-02T03:00", "2025-11-02T05:30"),  # → 01:30 EDT
        (NEW_YORK, {"start": "22:00", "end": "01:30"}, "2025-11-02T05:10", "2025-11-02T05:30"),  # 01:10 EDT
        (NEW_YORK, {"start": "22:00", "end": "01:30"}, "2025-11-02T05:40", None),  # 01:40 EDT: past the end
        (NEW_YORK, {"start": "22:00", "end": "01:30"}, "2025-11-02T06:10", "2025-11-02T06:30"),  # 01:10 EST
        # UTC when the subscriber has no time zone (and for a plain recipient)
        ("", NIGHT, "2025-06-10T23:00", "2025-06-11T07:00"),
        (None, NIGHT, "2025-06-11T06:00", "2025-06-11T07:00"),
        ("", NIGHT, "2025-06-11T07:00", None),
        # windows that do not cross midnight, or end at it
        ("", {"start": "09:00", "end": "17:00"}, "2025-06-10T12:00", "2025-06-10T17:00"),
        ("", {"start": "09:00", "end": "17:00"}, "2025-06-10T17:00", None),
        ("", {"start": "09:00", "end": "17:00"}, "2025-06-10T08:59", None),
        ("", {"start": "00:00", "end": "07:00"}, "2025-06-10T00:00", "2025-06-10T07:00"),
        ("", {"start": "00:00", "end": "07:00"}, "2025-06-10T23:30", None),
        ("", {"start": "22:00", "end": "00:00"}, "2025-06-10T23:00", "2025-06-11T00:00"),
        # 00:00–00:00 is no window at all
        ("", {"start": "00:00", "end": "00:00"}, "2025-06-10T00:00", None),
        (BERLIN, {"start": "00:00", "end": "00:00"}, "2025-06-10T23:00", None),
    ],
)  # fmt: skip
def test_release_is_the_local_end_of_the_window_now_falls_in(zone, window, created, released):
    quiet = quiet_hours.window(window, None)
    got = quiet_hours.release_at(quiet, quiet_hours.zone(zone), utc(created))
    assert got == (utc(released) if released else None)
    if got is not None:
        assert got > utc(created)
        local_end = datetime.strptime(window["end"], "%H:%M").time()
        shown = got.astimezone(quiet_hours.zone(zone)).time()
        # the clock shows the window's end then, or (in a gap) the first time after it
        assert shown == local_end or (shown > local_end and got.astimezone(quiet_hours.zone(zone)).dst())


def test_a_category_inherits_generals_window_unless_it_has_its_own():
    assert quiet_hours.window(None, NIGHT) == quiet_hours.window(NIGHT, None)
    assert quiet_hours.window({"start": "00:00", "end": "00:00"}, NIGHT) is None
    assert quiet_hours.window({"start": "12:00", "end": "13:00"}, NIGHT)[0].hour == 12
    assert quiet_hours.window(None, None) is None


def test_an_explicit_later_schedule_is_kept_an_earlier_one_moves_to_the_end():
    quiet = quiet_hours.window(NIGHT, None)
    now = utc("2025-06-10T23:00")
    end = utc("2025-06-11T07:00")
    assert quiet_hours.hold_until(quiet, "", now, None) == end
    assert quiet_hours.hold_until(quiet, "", now, end + timedelta(hours=3)) == end + timedelta(hours=3)
    assert quiet_hours.hold_until(quiet, "", now, now + timedelta(minutes=30)) == end
    assert quiet_hours.hold_until(quiet, "", utc("2025-06-10T12:00"), None) is None  # outside: untouched
    assert quiet_hours.hold_until(None, BERLIN, now, None) is None
    holds = quiet_hours.Holds(now)  # a batch's: one clock reading, each (window, zone) computed once
    assert [holds.hold_until(quiet, zone, None) for zone in ("", BERLIN, "", BERLIN)] == [
        end, utc("2025-06-11T05:00"), end, utc("2025-06-11T05:00")]  # fmt: skip
    assert holds.hold_until(quiet, "", end + timedelta(hours=1)) == end + timedelta(hours=1)


# --- the API --------------------------------------------------------------------------------------


def subscriber(client, external_id: str, zone: str = "") -> None:  # noqa: ANN001
    body = {"email": f"{external_id}@example.com", "push_tokens": [f"tok_{external_id}_0123456789"], "timezone": zone}
    assert client.put(f"/api/v1/subscribers/{external_id}", body, format="json").status_code in (200, 201)


def quiet(client, key: str, window: dict | None, **extra: object) -> None:  # noqa: ANN001
    if key == "general":
        response = client.patch("/api/v1/categories/general", {"quiet_hours": window, **extra}, format="json")
    else:
        response = client.post("/api/v1/categories", {"key": key, "quiet_hours": window, **extra}, format="json")
    assert response.status_code in (200, 201), response.content


def to(external_id: str, **extra: object) -> dict:
    return {"channel": "email", "subscriber": external_id, "subject": "s", "body": "b", **extra}


def created(client, body: dict, at: str) -> dict:  # noqa: ANN001
    with time_machine.travel(utc(at), tick=False):
        response = client.post(URL, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def job_run_at(notification_id: str) -> datetime:
    return ScheduledJob.objects.get(notification_id=notification_id, status="pending").run_at


@pytest.mark.django_db
def test_created_at_23_00_subscriber_time_is_scheduled_for_07_00_local(api_a, setup_a):
    quiet(api_a, "general", NIGHT)
    subscriber(api_a, "berlin", BERLIN)
    note = created(api_a, to("berlin"), "2025-06-10T21:00")  # 23:00 in Berlin
    assert note["status"] == "scheduled" and note["scheduled_job_id"]
    end = datetime(2025, 6, 11, 7, 0, tzinfo=ZoneInfo(BERLIN))
    assert datetime.fromisoformat(note["scheduled_for"]) == end
    assert job_run_at(note["id"]) == end
    detail = api_a.get(f"{URL}/{note['id']}").json()
    assert detail["status"] == "scheduled" and datetime.fromisoformat(detail["scheduled_for"]) == end
    # at 07:00 Berlin time the same request is queued at once
    assert created(api_a, to("berlin"), "2025-06-11T05:00")["status"] == "queued"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("zone", "created_at", "released"),
    [
        (BERLIN, "2025-03-29T20:00", "2025-03-30T05:00"),  # 21:00 CET: not yet
        (BERLIN, "2025-03-29T21:00", "2025-03-30T05:00"),  # 22:00 CET, the night clocks spring forward
        (BERLIN, "2025-10-25T20:00", "2025-10-26T06:00"),  # 22:00 CEST, the night clocks fall back
        (NEW_YORK, "2025-03-09T03:00", "2025-03-09T11:00"),  # 22:00 EST, spring forward
        (NEW_YORK, "2025-11-02T02:00", "2025-11-02T12:00"),  # 22:00 EDT, fall back
    ],
)
def test_across_the_dst_change_the_hold_ends_at_07_00_local(api_a, setup_a, zone, created_at, released):
    quiet(api_a, "general", NIGHT)
    subscriber(api_a, "someone", zone)
    note = created(api_a, to("someone"), created_at)
    if created_at == "2025-03-29T20:00":
        assert note["status"] == "queued"
        return
    assert note["status"] == "scheduled"
    assert job_run_at(note["id"]) == utc(released)
    assert utc(released).astimezone(ZoneInfo(zone)).hour == 7


@pytest.mark.django_db
def test_a_gap_end_is_the_first_instant_after_the_gap(api_a, setup_a):
    quiet(api_a, "general", {"start": "22:00", "end": "02:30"})
    subscriber(api_a, "berlin", BERLIN)
    note = created(api_a, to("berlin"), "2025-03-29T23:30")  # 00:30 CET; 02:30 does not exist that night
    assert job_run_at(note["id"]) == utc("2025-03-30T01:00")  # 03:00 CEST


@pytest.mark.django_db
def test_utc_applies_to_plain_recipients_and_subscribers_without_a_time_zone(api_a, setup_a):
    quiet(api_a, "general", NIGHT)
    subscriber(api_a, "nowhere")
    for body in (email(), to("nowhere")):
        note = created(api_a, body, "2025-06-10T23:00")
        assert note["status"] == "scheduled" and job_run_at(note["id"]) == utc("2025-06-11T07:00")
        assert created(api_a, body, "2025-06-10T21:00")["status"] == "queued"  # 21:00 UTC (23:00 in Berlin)


@pytest.mark.django_db
def test_critical_categories_are_never_held(api_a, setup_a):
    quiet(api_a, "general", NIGHT)
    quiet(api_a, "security", NIGHT, critical=True)
    subscriber(api_a, "berlin", BERLIN)
    note = created(api_a, to("berlin", category="security"), "2025-06-10T21:00")
    assert note["status"] == "queued" and not ScheduledJob.objects.filter(notification_id=note["id"]).exists()


@pytest.mark.django_db
def test_categories_inherit_generals_window_or_use_their_own(api_a, setup_a):
    quiet(api_a, "general", NIGHT)
    quiet(api_a, "news", None)  # inherits general's
    quiet(api_a, "digest", {"start": "20:00", "end": "09:00"})
    quiet(api_a, "alerts", {"start": "00:00", "end": "00:00"})  # none, whatever general's says
    subscriber(api_a, "berlin", BERLIN)
    at = "2025-06-10T21:00"  # 23:00 in Berlin
    assert job_run_at(created(api_a, to("berlin", category="news"), at)["id"]) == utc("2025-06-11T05:00")
    assert job_run_at(created(api_a, to("berlin", category="digest"), at)["id"]) == utc("2025-06-11T07:00")
    assert created(api_a, to("berlin", category="alerts"), at)["status"] == "queued"
    assert created(api_a, to("berlin", category="digest"), "2025-06-10T18:30")["status"] == "scheduled"  # 20:30
    # general's window changed: the next create sees it (the cached configuration is stale)
    quiet(api_a, "general", {"start": "00:00", "end": "00:00"})
    assert created(api_a, to("berlin", category="news"), at)["status"] == "queued"


@pytest.mark.django_db
def test_an_explicit_later_scheduled_for_is_kept_an_earlier_one_is_moved(api_a, setup_a):
    quiet(api_a, "general", NIGHT)
    subscriber(api_a, "berlin", BERLIN)
    later = "2025-06-11T09:00:00+00:00"
    note = created(api_a, to("berlin", scheduled_for=later), "2025-06-10T21:00")
    assert job_run_at(note["id"]) == datetime.fromisoformat(later)
    note = created(api_a, to("berlin", scheduled_for="2025-06-10T23:00:00+00:00"), "2025-06-10T21:00")
    assert job_run_at(note["id"]) == utc("2025-06-11T05:00")


@pytest.mark.django_db
def test_opted_out_notifications_are_suppressed_not_held(api_a, setup_a):
    quiet(api_a, "general", NIGHT)
    body = {"email": "o@example.com", "timezone": BERLIN, "preferences": {"general": {"email": False}}}
    assert api_a.put("/api/v1/subscribers/out", body, format="json").status_code == 201
    note = created(api_a, to("out"), "2025-06-10T21:00")
    assert note["status"] == "suppressed" and not ScheduledJob.objects.filter(notification_id=note["id"]).exists()


@pytest.mark.django_db
def test_a_batch_holds_each_in_its_own_time_zone_in_the_same_statements(api_a, setup_a):
    quiet(api_a, "general", NIGHT)
    zones = [BERLIN, NEW_YORK, "Asia/Tokyo", ""]
    for i, zone in enumerate(zones):
        subscriber(api_a, f"s{i}", zone)

    def batch(count: int) -> tuple[list[dict], int]:
        items = [to(f"s{i % len(zones)}") for i in range(count)]
        tenant_config.clear()
        api_a.post(URL + "/batch", {"notifications": items[:1]}, format="json")  # warm the configuration
        with time_machine.travel(utc("2025-06-10T21:00"), tick=False), CaptureQueriesContext(connection) as ctx:
            response = api_a.post(URL + "/batch", {"notifications": items}, format="json")
        assert response.status_code == 201, response.content
        return response.json()["results"], len(ctx.captured_queries)

    small, small_statements = batch(4)
    large, large_statements = batch(40)
    assert small_statements == large_statements
    # 23:00 in Berlin and 17:00 in New York (UTC-4), 06:00 in Tokyo (UTC+9), 21:00 in UTC
    expected = {0: ("scheduled", utc("2025-06-11T05:00")), 1: ("queued", None),
                2: ("scheduled", utc("2025-06-10T22:00")), 3: ("queued", None)}  # fmt: skip
    for i, row in enumerate(large):
        status, end = expected[i % len(zones)]
        assert row["status"] == status, (i, row)
        if end is not None:
            assert job_run_at(row["id"]) == end


@pytest.mark.django_db
def test_the_hot_path_holds_too_in_its_two_statements(api_a, setup_a, monkeypatch, django_capture_on_commit_callbacks):
    quiet(api_a, "general", NIGHT)
    subscriber(api_a, "berlin", BERLIN)
    created(api_a, to("berlin"), "2025-06-10T12:00")  # warm key, configuration and rate-limit tokens

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the view was called")

    monkeypatch.setattr(views.NotificationViewSet, "create", refuse)  # a 201 now comes from the hot path only
    with (
        time_machine.travel(utc("2025-06-10T21:00"), tick=False),
        CaptureQueriesContext(connection) as ctx,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = api_a.post(URL, to("berlin"), format="json")
    assert response.status_code == 201 and response.json()["status"] == "scheduled", response.content
    assert len(ctx.captured_queries) == 2, [q["sql"][:80] for q in ctx.captured_queries]  # subscriber, create
    assert job_run_at(response.json()["id"]) == utc("2025-06-11T05:00")


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "window",
    [
        {"start": "22:00"}, {"start": "22:00", "end": "7:00"}, {"start": "24:00", "end": "07:00"},
        {"start": "22:00", "end": "07:60"}, {"start": "22:00", "end": "07:00", "tz": "UTC"},
        {"start": 22, "end": 7}, "22:00-07:00", ["22:00", "07:00"], {"start": "07:00", "end": "07:00"},
    ],
)  # fmt: skip
def test_bad_quiet_hours_are_400_on_the_field_and_in_the_admin(api_a, setup_a, window):
    response = api_a.post("/api/v1/categories", {"key": "news", "quiet_hours": window}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["details"]) == ["quiet_hours"]
    response = api_a.patch("/api/v1/categories/general", {"quiet_hours": window}, format="json")
    assert response.status_code == 400 and "quiet_hours" in response.json()["error"]["details"]
    assert Category.objects.get(key="general").quiet_hours is None

    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root", "root@example.invalid", "pw-0123456789"))
    form = {"tenant": setup_a.tenant.pk, "key": "digest", "description": ""}
    page = admin.post("/admin/recipients/category/add/", {**form, "quiet_hours": json.dumps(window)})
    assert page.status_code == 200 and b"errorlist" in page.content  # the form again, with the error
    assert not Category.objects.filter(key="digest").exists()
    page = admin.post("/admin/recipients/category/add/", {**form, "quiet_hours": json.dumps(NIGHT)})
    assert page.status_code == 302 and Category.objects.get(key="digest").quiet_hours == NIGHT


# --- end to end: held through the API, released by a real scheduler -------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_held_notification_is_released_by_the_scheduler_process_and_delivered(
    tenant_a, api_a, subprocess_env, tmp_path
):
    """Held at 23:00 Berlin time two days ago (time-machine, in this process), so its release at 07:00
    the next morning is already past for the scheduler process, which runs on the database's clock."""
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60) as receiver:
        factories.provider(tenant_a, "push", channel="push", config={"url": receiver.url},
                           secrets={"signing_secret": TEST_SIGNING_SECRET}, is_default=True)  # fmt: skip
        quiet(api_a, "general", NIGHT)
        subscriber(api_a, "berlin", BERLIN)
        berlin = ZoneInfo(BERLIN)
        day = (datetime.now(berlin) - timedelta(days=2)).date()
        at = datetime(day.year, day.month, day.day, 23, 0, tzinfo=berlin)
        release = datetime.combine(day + timedelta(days=1), datetime.min.time().replace(hour=7), tzinfo=berlin)
        with time_machine.travel(at, tick=False):
            response = api_a.post(URL, {"channel": "push", "subscriber": "berlin", "body": "good morning"},
                                  format="json")  # fmt: skip
        assert response.status_code == 201, response.content
        note = response.json()
        assert note["status"] == "scheduled" and job_run_at(note["id"]) == release
        assert api_a.get(f"{URL}/{note['id']}").json()["status"] == "scheduled"
        assert not receiver.requests

        log = tmp_path / "scheduler.log"
        scheduler = start_scheduler(subprocess_env, log)
        dispatchers = start_dispatchers(1, subprocess_env, log_dir=tmp_path)
        try:
            wait_for_text(log, "scheduler ready", scheduler)
            assert wait_started(tmp_path, 1)
            assert wait_until(lambda: Notification.objects.filter(pk=note["id"], status="delivered").exists(), 30)
        finally:
            for proc in [scheduler, *dispatchers]:
                proc.terminate()
            assert wait_exit([scheduler, *dispatchers], 20) == [0, 0]
        assert ScheduledJob.objects.get(notification_id=note["id"]).status == "executed"
        assert len(receiver.requests) == 1 and receiver.requests[0].verified
        assert "good morning" in receiver.requests[0].body.decode()
        assert api_a.get(f"{URL}/{note['id']}").json()["status"] == "delivered"


@pytest.mark.django_db
def test_sequence_steps_created_inside_quiet_hours_wait_for_their_end(api_a, setup_a):
    quiet(api_a, "general", NIGHT)
    for i in range(3):
        Template.objects.create(tenant=setup_a.tenant, key=f"drip{i}", channel="email", body=f"step {i}")
    offsets = (0, 3600, 10 * 3600)  # 23:00, midnight, 09:00 (UTC: a plain recipient)
    steps = [StepSpec(offset, "email", f"drip{i}") for i, offset in enumerate(offsets)]
    sequences.create_sequence(setup_a.tenant, "drip", "", steps, actor="test")
    with time_machine.travel(utc("2025-06-10T23:00"), tick=False):
        enrollment = sequences.enroll(setup_a.tenant, "drip", recipient="j@example.com", context={}, actor="test")
    runs = sorted(job_run_at(str(n.pk)) for n in enrollment.step_notifications)
    assert runs == [utc("2025-06-11T07:00"), utc("2025-06-11T07:00"), utc("2025-06-11T09:00")]
