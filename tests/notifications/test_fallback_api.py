"""`fallback` on a notification create: validation with field-level 400s (single
and batch), the linked notification stored with the original in the create's statement (the
subscriber's address on the next channel, the same subject/body/template, `scheduled` without a job),
the detail's `fallback`, `fallback_of` and `fallback_notification_id`, and what cancels it at creation."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifications import tenant_config
from notifications.models import Notification
from providers.models import Provider
from queueing.models import QueueItem, ScheduledJob
from recipients import suppressions
from tests.support.setups import EMAIL, PHONE, TOKEN

URL = "/api/v1/notifications"
pytestmark = pytest.mark.django_db

SMS_AFTER_5_MIN = [{"channel": "sms", "after_seconds": 300}]


@pytest.fixture
def subscriber_a(api_a, setup_a) -> str:  # noqa: ANN001
    body = {"phone": PHONE, "push_tokens": [TOKEN, "tok_second_token_0000"]}
    assert api_a.put("/api/v1/subscribers/user-1", body, format="json").status_code == 201
    return "user-1"


def push(**extra: object) -> dict:
    return {"channel": "push", "subscriber": "user-1", "subject": "Your code", "body": "Code 4711", **extra}


def test_a_create_stores_the_fallback_beside_the_notification(api_a, setup_a, subscriber_a):
    response = api_a.post(URL, push(fallback=SMS_AFTER_5_MIN, priority=7, metadata={"order": 9}), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["fallback"] == SMS_AFTER_5_MIN and data["fallback_of"] is None
    original = Notification.objects.get(pk=data["id"])
    linked = Notification.objects.get(pk=data["fallback_notification_id"])
    assert original.recipient == TOKEN and original.status == "queued"
    assert (linked.channel, linked.recipient, linked.provider_id, linked.status) == ("sms", PHONE, setup_a.text.pk,
                                                                                     "scheduled")
    assert linked.fallback_of == original.pk and linked.fallback is None and linked.fallback_notification_id is None
    assert (linked.subject, linked.body, linked.priority) == ("Your code", "Code 4711", 7)
    assert linked.metadata == {"order": 9}
    assert (linked.subscriber, linked.recipient_masked, linked.scheduled_for) == ("user-1", "+1******4567", None)
    # nothing is due until the original's fate says when: no job, no queue item
    assert not ScheduledJob.objects.filter(notification_id=linked.pk).exists()
    assert not QueueItem.objects.filter(notification_id=linked.pk).exists()
    assert QueueItem.objects.filter(notification_id=original.pk).exists()
    # the list shows only what was asked for... and the fallback as a notification of its own
    listed = {n["id"]: n for n in api_a.get(URL).json()["results"]}
    assert set(listed) == {str(original.pk), str(linked.pk)}
    assert listed[str(linked.pk)]["fallback_of"] == str(original.pk)
    assert listed[str(original.pk)]["fallback"] == SMS_AFTER_5_MIN
    assert listed[str(original.pk)]["fallback_notification_id"] == str(linked.pk)


def test_the_detail_shows_both_ends_of_the_link(api_a, setup_a, subscriber_a):
    data = api_a.post(URL, push(fallback=SMS_AFTER_5_MIN), format="json").json()
    original = api_a.get(f"{URL}/{data['id']}").json()
    linked = api_a.get(f"{URL}/{data['fallback_notification_id']}").json()
    assert original == {**original, "fallback": SMS_AFTER_5_MIN, "fallback_of": None,
                        "fallback_notification_id": data["fallback_notification_id"], "status": "queued"}  # fmt: skip
    assert linked == {**linked, "channel": "sms", "recipient_masked": "+1******4567", "status": "scheduled",
                      "fallback": None, "fallback_of": data["id"], "fallback_notification_id": None,
                      "scheduled_for": None, "scheduled_job_id": None, "attempts": [], "events": []}  # fmt: skip
    plain = api_a.get(f"{URL}/{api_a.post(URL, push(), format='json').json()['id']}").json()
    assert (plain["fallback"], plain["fallback_of"], plain["fallback_notification_id"]) == (None, None, None)


def test_a_template_is_carried_to_the_fallback(api_a, setup_a, subscriber_a):
    api_a.put("/api/v1/subscribers/user-2", {"email": EMAIL, "phone": PHONE}, format="json")
    body = {"channel": "email", "subscriber": "user-2", "template": "welcome", "context": {"name": "Ann"},
            "fallback": [{"channel": "sms", "after_seconds": 0}]}  # fmt: skip
    data = api_a.post(URL, body, format="json").json()
    linked = api_a.get(f"{URL}/{data['fallback_notification_id']}").json()
    assert (linked["template"], linked["subject"], linked["body"], linked["context"]) == (
        "welcome", "Hi Ann", "Welcome, Ann!", {"name": "Ann"})


def test_a_fallback_costs_the_create_no_statement(api_a, setup_a, subscriber_a, django_capture_on_commit_callbacks):
    assert api_a.post(URL, push(), format="json").status_code == 201  # warm: key, configuration, tokens
    counts = []
    for body in (push(), push(fallback=SMS_AFTER_5_MIN)):
        with CaptureQueriesContext(connection) as ctx, django_capture_on_commit_callbacks(execute=True):
            assert api_a.post(URL, body, format="json").status_code == 201
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1] == 2  # the subscriber, the create statement (the doorbell: queueing.ringer)
    batch = {"notifications": [push(fallback=SMS_AFTER_5_MIN) for _ in range(50)]}
    with CaptureQueriesContext(connection) as ctx, django_capture_on_commit_callbacks(execute=True):
        response = api_a.post(f"{URL}/batch", batch, format="json")
    assert response.status_code == 201 and len(ctx.captured_queries) == 2
    results = response.json()["results"]
    assert len(results) == 50 and all(r["fallback_notification_id"] for r in results)
    linked = Notification.objects.filter(pk__in=[r["fallback_notification_id"] for r in results])
    assert sorted(set(linked.values_list("status", "channel"))) == [("scheduled", "sms")]
    assert {n.fallback_of for n in linked} == {uuid.UUID(r["id"]) for r in results}


@pytest.mark.parametrize(
    ("fallback", "message"),
    [
        ({"channel": "sms"}, "must be a list of one step"),
        ([], None),  # no fallback
        ([{"channel": "sms", "after_seconds": 1}, {"channel": "email", "after_seconds": 2}], "at most one fallback"),
        (["sms"], "each step must be an object"),
        ([{"channel": "push", "after_seconds": 1}], "must differ from the notification's own ('push')"),
        ([{"channel": "webhook", "after_seconds": 1}], "must be one of email, sms, push"),
        ([{"channel": "fax", "after_seconds": 1}], "must be one of email, sms, push"),
        ([{"after_seconds": 1}], "must be one of email, sms, push"),
        ([{"channel": "sms"}], "after_seconds must be an integer"),
        ([{"channel": "sms", "after_seconds": -1}], "after_seconds must be an integer"),
        ([{"channel": "sms", "after_seconds": 1.5}], "after_seconds must be an integer"),
        ([{"channel": "sms", "after_seconds": "60"}], "after_seconds must be an integer"),
        ([{"channel": "sms", "after_seconds": True}], "after_seconds must be an integer"),
        ([{"channel": "sms", "after_seconds": 10**12}], "after_seconds must be an integer from 0 to"),
        ([{"channel": "sms", "after_seconds": 1, "provider": "text"}], "unknown key(s) provider"),
    ],
)
def test_a_bad_fallback_is_a_field_error(api_a, setup_a, subscriber_a, fallback, message):
    response = api_a.post(URL, push(fallback=fallback), format="json")
    if message is None:
        assert response.status_code == 201 and response.json()["fallback_notification_id"] is None
        return
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error" and list(error["details"]) == ["fallback"]
    assert message in error["details"]["fallback"][0]
    assert not Notification.objects.exists()


def test_a_fallback_needs_a_subscriber_with_an_address_and_a_provider_there(api_a, setup_a, subscriber_a):
    by_address = {"channel": "push", "recipient": TOKEN, "body": "b", "fallback": SMS_AFTER_5_MIN}
    details = api_a.post(URL, by_address, format="json").json()["error"]["details"]
    assert list(details) == ["fallback"] and "needs `subscriber`" in details["fallback"][0]

    no_email = api_a.post(URL, push(fallback=[{"channel": "email", "after_seconds": 5}]), format="json")
    assert no_email.status_code == 400
    assert "has no address for the fallback channel 'email'" in no_email.json()["error"]["details"]["fallback"][0]

    Provider.objects.filter(pk=setup_a.text.pk).update(is_default=False)
    tenant_config.forget(setup_a.tenant.pk)
    no_provider = api_a.post(URL, push(fallback=SMS_AFTER_5_MIN), format="json")
    assert no_provider.status_code == 400
    assert "no default provider for the fallback channel 'sms'" in no_provider.json()["error"]["details"]["fallback"][0]
    assert not Notification.objects.exists()


def test_a_batch_names_the_index_of_a_bad_fallback(api_a, setup_a, subscriber_a):
    items = [push(fallback=SMS_AFTER_5_MIN), push(fallback=[{"channel": "sms", "after_seconds": -5}]),
             push(fallback=[{"channel": "email", "after_seconds": 5}])]  # fmt: skip
    response = api_a.post(f"{URL}/batch", {"notifications": items}, format="json")
    assert response.status_code == 400
    details = response.json()["error"]["details"]["notifications"]
    assert sorted(details) == ["1", "2"] and all(list(d) == ["fallback"] for d in details.values())
    assert not Notification.objects.exists()


def test_an_opt_out_on_the_fallback_channel_suppresses_the_fallback(api_a, setup_a, subscriber_a):
    api_a.post("/api/v1/categories", {"key": "news"}, format="json")
    api_a.patch("/api/v1/subscribers/user-1", {"preferences": {"news": {"sms": False}}}, format="json")
    data = api_a.post(URL, push(category="news", fallback=SMS_AFTER_5_MIN), format="json").json()
    assert data["status"] == "queued"
    assert Notification.objects.get(pk=data["fallback_notification_id"]).status == "suppressed"


def test_a_suppressed_original_cancels_its_fallback_at_creation(api_a, setup_a, subscriber_a):
    suppressions.suppress(setup_a.tenant.pk, "push", TOKEN, "manual")
    data = api_a.post(URL, push(fallback=SMS_AFTER_5_MIN), format="json").json()
    assert data["status"] == "suppressed"
    assert Notification.objects.get(pk=data["fallback_notification_id"]).status == "cancelled"


def test_a_suppressed_fallback_address_is_suppressed_at_creation(api_a, setup_a, subscriber_a):
    suppressions.suppress(setup_a.tenant.pk, "sms", PHONE, "manual")
    data = api_a.post(URL, push(fallback=SMS_AFTER_5_MIN), format="json").json()
    assert data["status"] == "queued"
    assert Notification.objects.get(pk=data["fallback_notification_id"]).status == "suppressed"


def test_cancelling_the_original_cancels_its_fallback(api_a, setup_a, subscriber_a):
    data = api_a.post(URL, push(fallback=SMS_AFTER_5_MIN), format="json").json()
    response = api_a.post(f"{URL}/{data['id']}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert Notification.objects.get(pk=data["fallback_notification_id"]).status == "cancelled"


def test_another_tenants_subscriber_gives_no_fallback(api_b, setup_b, subscriber_a):
    response = api_b.post(URL, push(fallback=SMS_AFTER_5_MIN), format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["details"]) == ["subscriber"]
