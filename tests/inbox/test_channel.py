"""The in_app channel: creation rules, the built-in inbox provider, and delivery into the feed by a real
dispatcher (one item per notification, written in the record statement)."""

from __future__ import annotations

import pytest

from inbox.models import InboxItem
from notifications.models import Notification
from providers.models import Provider
from tests.inbox.support import notify, subscriber
from tests.queueing.dispatch_support import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_recipient_is_refused_and_a_subscriber_is_required(api_a):
    made = api_a.post("/api/v1/notifications", {"channel": "in_app", "recipient": "x", "body": "b"}, format="json")
    assert made.status_code == 400
    assert "recipient" in made.json()["error"]["details"]
    made = api_a.post("/api/v1/notifications", {"channel": "in_app", "body": "b"}, format="json")
    assert made.status_code == 400
    assert "subscriber" in made.json()["error"]["details"]


def test_unknown_subscriber_and_push_only_fields_and_large_data_are_400(api_a):
    made = api_a.post("/api/v1/notifications", {"channel": "in_app", "subscriber": "nobody", "body": "b"},
                      format="json")  # fmt: skip
    assert made.status_code == 400
    subscriber(api_a)
    for field, value in (("badge", 1), ("data", "text"), ("data", {"k": "x" * 5000}), ("action_url", 3)):
        made = api_a.post("/api/v1/notifications", {"channel": "in_app", "subscriber": "jane", "body": "b",
                                                    field: value}, format="json")  # fmt: skip
        assert made.status_code == 400, (field, made.content)
        assert field in made.json()["error"]["details"]


def test_every_tenant_gets_one_inbox_provider_on_its_first_in_app_notification(api_a, api_b, tenant_a, tenant_b):
    for api in (api_a, api_b):
        subscriber(api)
        notify(api)
        notify(api)
    for tenant in (tenant_a, tenant_b):
        (provider,) = Provider.objects.for_tenant(tenant).filter(channel="in_app")
        assert (provider.name, provider.kind, provider.is_default) == ("inbox", "inbox", True)
    assert Notification.objects.filter(channel="in_app", status="queued").count() == 4


def test_a_dispatcher_writes_one_feed_item_per_notification(api_a, api_b, tenant_a, subprocess_env, tmp_path):
    subscriber(api_a)
    subscriber(api_a, "joe")
    subscriber(api_b)
    ids = [notify(api_a, subject=f"n{i}", data={"order": str(i)}, action_url=f"/orders/{i}") for i in range(3)]
    other = notify(api_a, "joe", subject="for joe")
    foreign = notify(api_b, subject="tenant b")
    drain(subprocess_env, tmp_path / "run")

    assert set(Notification.objects.filter(channel="in_app").values_list("status", flat=True)) == {"delivered"}
    items = InboxItem.objects.for_tenant(tenant_a).filter(subscriber="jane").order_by("created_at")
    assert [(str(i.notification_id), i.title, i.body, i.data, i.action_url) for i in items] == [
        (n, f"n{i}", f"n{i}!", {"order": str(i)}, f"/orders/{i}") for i, n in enumerate(ids)
    ]
    assert InboxItem.objects.filter(notification_id=other, subscriber="joe").count() == 1
    assert InboxItem.objects.exclude(tenant=tenant_a).get().notification_id.hex == foreign.replace("-", "")
    detail = api_a.get(f"/api/v1/notifications/{ids[0]}").json()
    assert [a["outcome"] for a in detail["attempts"]] == ["delivered"]
