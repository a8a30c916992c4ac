"""The check at creation: a notification to a suppressed address is stored `suppressed` (201, never
queued or scheduled, no attempt), decided inside the create statement; critical categories ignore
category-scoped entries, never those for every category."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifications import services
from notifications.models import DeliveryAttempt, IdempotencyRecord, Notification
from queueing.models import QueueItem, ScheduledJob
from recipients import suppressions
from tests.support.setups import EMAIL, PHONE, email

pytestmark = pytest.mark.django_db
URL = "/api/v1/notifications"


def test_a_suppressed_address_is_stored_suppressed_in_the_create_statement(api_a, setup_a, tenant_b):
    suppressions.suppress(setup_a.tenant.pk, "email", EMAIL.upper(), "hard_bounce")
    suppressions.suppress(tenant_b.pk, "email", "other@example.com", "hard_bounce")  # another tenant's
    assert api_a.post(URL, email(recipient="other@example.com"), format="json").json()["status"] == "queued"
    with CaptureQueriesContext(connection) as ctx:
        response = api_a.post(URL, email(), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "suppressed" and response.json()["enqueued_at"] is None
    # the statement that found the entry stored nothing; the second stored the row; no doorbell
    assert len(ctx.captured_queries) == 2, [q["sql"][:80] for q in ctx.captured_queries]
    note = Notification.objects.get(pk=response.json()["id"])
    assert note.status == "suppressed" and note.enqueued_at is None
    assert not QueueItem.objects.filter(notification_id=note.pk).exists()
    assert not DeliveryAttempt.objects.filter(notification_id=note.pk).exists()
    assert api_a.get(f"{URL}/{note.pk}").json()["status"] == "suppressed"
    listed = api_a.get(URL, {"status": "suppressed"}).json()["results"]
    assert [n["id"] for n in listed] == [str(note.pk)]
    # the same address on SMS is another entry: not blocked
    assert api_a.post(URL, {"channel": "sms", "recipient": PHONE, "body": "b"}, format="json").json()["status"] == (
        "queued"
    )


def test_a_batch_suppresses_only_the_blocked_items_and_a_scheduled_one_gets_no_job(api_a, setup_a):
    suppressions.suppress(setup_a.tenant.pk, "email", "b@example.com", "complaint")
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    items = [
        email(recipient="a@example.com"),
        email(recipient="B@Example.com"),
        email(recipient="b@example.com", scheduled_for=later),
        email(recipient="c@example.com", scheduled_for=later),
    ]
    response = api_a.post(f"{URL}/batch", {"notifications": items}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert response.status_code == 201, response.content
    statuses = [n["status"] for n in response.json()["results"]]
    assert statuses == ["queued", "suppressed", "suppressed", "scheduled"]
    ids = [n["id"] for n in response.json()["results"]]
    assert set(QueueItem.objects.values_list("notification_id", flat=True)) == {Notification.objects.get(pk=ids[0]).pk}
    assert [str(j.notification_id) for j in ScheduledJob.objects.all()] == [ids[3]]
    assert IdempotencyRecord.objects.get(key="k-1").response_status == 201
    replay = api_a.post(f"{URL}/batch", {"notifications": items}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert replay.content == response.content and replay["Idempotent-Replayed"] == "true"


def test_a_suppression_removed_between_rounds_is_no_longer_applied(setup_a, monkeypatch):
    entry, _ = suppressions.suppress(setup_a.tenant.pk, "email", EMAIL, "manual")
    real = services._store
    calls = []

    def store(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(kwargs["check"][1])
        found = real(*args, **kwargs)
        if found is not None and len(calls) == 1:
            suppressions.remove(setup_a.tenant.pk, entry.pk, actor="test")  # gone before the next round
        return found

    monkeypatch.setattr(services, "_store", store)
    spec = services.NotificationSpec(channel="email", recipient=EMAIL, provider=setup_a.mail, body="b")
    (note,) = services.create_notifications(setup_a.tenant, [spec], actor="test")
    assert calls == [[], [0], []]  # expected none; found it; expected it, found none; stored queued
    assert note.status == "queued" and Notification.objects.get(pk=note.pk).status == "queued"
    assert QueueItem.objects.filter(notification_id=note.pk).exists()


@pytest.mark.parametrize(
    ("category_of_entry", "critical", "blocked"),
    [(None, False, True), (None, True, True), ("general", False, True), ("general", True, False),
     ("news", False, False)],
)  # fmt: skip
def test_critical_categories_ignore_category_scoped_entries_only(setup_a, category_of_entry, critical, blocked):
    suppressions.suppress(setup_a.tenant.pk, "email", EMAIL, "unsubscribed", category_of_entry)
    spec = services.NotificationSpec(
        channel="email", recipient=EMAIL, provider=setup_a.mail, body="b", category="general", critical=critical
    )
    (note,) = services.create_notifications(setup_a.tenant, [spec], actor="test")
    assert Notification.objects.get(pk=note.pk).status == ("suppressed" if blocked else "queued")
    assert QueueItem.objects.filter(notification_id=note.pk).exists() is not blocked


def test_an_opted_out_spec_is_stored_suppressed_without_a_lookup_round(setup_a):
    spec = services.NotificationSpec(channel="email", recipient=EMAIL, provider=setup_a.mail, body="b", opted_out=True)
    with CaptureQueriesContext(connection) as ctx:
        (note,) = services.create_notifications(setup_a.tenant, [spec], actor="test")
    assert len(ctx.captured_queries) == 1
    assert Notification.objects.get(pk=note.pk).status == "suppressed"
    assert not QueueItem.objects.exists()


def test_the_console_filters_suppressed_notifications(admin_client, api_a, setup_a):
    suppressions.suppress(setup_a.tenant.pk, "email", EMAIL, "manual")
    blocked = api_a.post(URL, email(), format="json").json()["id"]
    sent = api_a.post(URL, email(recipient="x@example.com"), format="json").json()["id"]
    page = admin_client.get("/admin/notifications/notification/", {"status": "suppressed"}).content.decode()
    assert blocked in page and sent not in page
    assert "Suppressed" in page
