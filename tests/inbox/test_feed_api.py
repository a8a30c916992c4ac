"""The subscriber's API /inbox/v1/: feed (cursor, status and category filters), counts, the item states
(idempotent, read implies seen), mark-all, another subscriber's item 404; the first seen / read of an
item become the notification's events and `notification.seen` / `notification.read` event webhooks."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from events.models import Event
from inbox import statements
from inbox.models import InboxItem
from tests.conftest import client_for
from tests.inbox.support import notify, subscriber

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def token(api, external_id: str = "jane") -> str:  # noqa: ANN001
    made = api.post(f"/api/v1/subscribers/{external_id}/inbox-token", {}, format="json")
    assert made.status_code == 201, made.content
    return made.json()["token"]


def reader(api, external_id: str = "jane"):  # noqa: ANN001, ANN201
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token(api, external_id)}")
    return client


def item(tenant, external_id: str = "jane", n: int = 0, category: str = "general",
         notification_id: str | None = None) -> InboxItem:  # fmt: skip
    """An item as a delivery writes it (its counts included)."""
    made = InboxItem.objects.create(
        id=uuid.uuid4(), tenant=tenant, subscriber=external_id, notification_id=notification_id or uuid.uuid4(),
        category=category, title=f"t{n}", body=f"b{n}", data={"n": n}, action_url=f"/x/{n}",
        created_at=T0 + timedelta(minutes=n),
    )  # fmt: skip
    statements.recount(tenant.pk, external_id)
    return made


def titles(client, query: str = "") -> list[str]:  # noqa: ANN001
    response = client.get(f"/inbox/v1/feed{query}")
    assert response.status_code == 200, response.content
    return [i["title"] for i in response.json()["results"]]


def test_feed_newest_first_with_a_cursor_and_only_the_subscribers_items(api_a, api_b, tenant_a, tenant_b):
    subscriber(api_a)
    subscriber(api_a, "joe")
    subscriber(api_b)
    for n in range(5):
        item(tenant_a, n=n)
    item(tenant_a, "joe", n=10)
    item(tenant_b, n=20)
    jane = reader(api_a)
    page = jane.get("/inbox/v1/feed?limit=2").json()
    assert [i["title"] for i in page["results"]] == ["t4", "t3"]
    assert set(page["results"][0]) == {"id", "notification_id", "category", "title", "body", "data", "action_url",
                                       "created_at", "seen_at", "read_at", "archived_at"}  # fmt: skip
    assert page["results"][0]["data"] == {"n": 4} and page["results"][0]["action_url"] == "/x/4"
    second = jane.get(page["next"]).json()
    assert [i["title"] for i in second["results"]] == ["t2", "t1"]
    assert [i["title"] for i in jane.get(second["next"]).json()["results"]] == ["t0"]
    assert titles(reader(api_a, "joe")) == ["t10"]
    assert titles(reader(api_b)) == ["t20"]


def test_filters_counts_and_states(api_a, tenant_a):
    subscriber(api_a)
    items = [item(tenant_a, n=n, category="news" if n % 2 else "general") for n in range(4)]
    jane = reader(api_a)
    assert jane.get("/inbox/v1/counts").json() == {"unseen": 4, "unread": 4, "total": 4}

    seen = jane.post(f"/inbox/v1/feed/{items[0].id}/seen")
    assert seen.status_code == 200 and seen.json()["seen_at"] and seen.json()["read_at"] is None
    again = jane.post(f"/inbox/v1/feed/{items[0].id}/seen").json()
    assert again["seen_at"] == seen.json()["seen_at"]  # repeating changes nothing

    read = jane.post(f"/inbox/v1/feed/{items[1].id}/read").json()
    assert read["read_at"] and read["seen_at"]  # read implies seen
    assert jane.get("/inbox/v1/counts").json() == {"unseen": 2, "unread": 3, "total": 4}
    assert titles(jane, "?status=unseen") == ["t3", "t2"]
    assert titles(jane, "?status=unread") == ["t3", "t2", "t0"]
    assert titles(jane, "?category=news") == ["t3", "t1"]

    unread = jane.post(f"/inbox/v1/feed/{items[1].id}/unread").json()
    assert unread["read_at"] is None and unread["seen_at"] == read["seen_at"]  # unread keeps seen_at

    archived = jane.post(f"/inbox/v1/feed/{items[3].id}/archive").json()
    assert archived["archived_at"]
    assert titles(jane) == ["t2", "t1", "t0"]
    assert titles(jane, "?status=archived") == ["t3"]
    assert titles(jane, "?status=unseen") == ["t2"]  # archived items are left out
    assert jane.get("/inbox/v1/counts").json() == {"unseen": 1, "unread": 3, "total": 3}
    assert jane.post(f"/inbox/v1/feed/{items[3].id}/unarchive").json()["archived_at"] is None
    assert titles(jane) == ["t3", "t2", "t1", "t0"]

    for bad in ("?status=new", "?category=a%20b", "?page=2", "?cursor=zzz", "?limit=0"):
        assert jane.get(f"/inbox/v1/feed{bad}").status_code == 400, bad


def test_mark_all_counts_only_what_it_changed(api_a, tenant_a):
    subscriber(api_a)
    items = [item(tenant_a, n=n, category="news" if n < 2 else "general") for n in range(5)]
    jane = reader(api_a)
    jane.post(f"/inbox/v1/feed/{items[4].id}/archive")
    jane.post(f"/inbox/v1/feed/{items[3].id}/read")
    assert jane.post("/inbox/v1/feed/mark-all", {"state": "read", "category": "news"}, format="json").json() == {
        "updated": 2
    }
    assert jane.post("/inbox/v1/feed/mark-all", {"state": "read"}, format="json").json() == {"updated": 1}
    assert jane.post("/inbox/v1/feed/mark-all", {"state": "read"}, format="json").json() == {"updated": 0}
    assert InboxItem.objects.get(pk=items[4].id).read_at is None  # archived: left out
    assert jane.get("/inbox/v1/counts").json() == {"unseen": 0, "unread": 0, "total": 4}
    assert jane.post("/inbox/v1/feed/mark-all", {"state": "archived"}, format="json").json() == {"updated": 4}
    assert jane.get("/inbox/v1/counts").json() == {"unseen": 0, "unread": 0, "total": 0}
    for bad in ({}, {"state": "unread"}, {"state": "read", "category": 3}, {"state": "read", "x": 1}):
        assert jane.post("/inbox/v1/feed/mark-all", bad, format="json").status_code == 400, bad


def test_another_subscribers_or_tenants_item_is_404(api_a, api_b, tenant_a, tenant_b):
    subscriber(api_a)
    subscriber(api_a, "joe")
    subscriber(api_b)
    joes = item(tenant_a, "joe")
    foreign = item(tenant_b)
    jane = reader(api_a)
    for target in (joes.id, foreign.id, uuid.uuid4(), "not-a-uuid"):
        for action in ("seen", "read", "unread", "archive", "unarchive"):
            assert jane.post(f"/inbox/v1/feed/{target}/{action}").status_code == 404
    assert jane.post(f"/inbox/v1/feed/{joes.id}/delete").status_code == 404
    assert InboxItem.objects.get(pk=joes.id).seen_at is None
    assert InboxItem.objects.get(pk=foreign.id).seen_at is None


def test_first_seen_and_read_become_events_and_webhook_events(api_a, tenant_a):
    subscriber(api_a)
    hook = api_a.post("/api/v1/event-endpoints", {"name": "ops", "url": "http://127.0.0.1:9/events",
                                                  "event_types": ["notification.seen", "notification.read"]},
                      format="json")  # fmt: skip
    assert hook.status_code == 201, hook.content
    first, second = notify(api_a, subject="one"), notify(api_a, subject="two")
    items = [item(tenant_a, n=0, notification_id=first), item(tenant_a, n=1, notification_id=second)]
    jane = reader(api_a)
    jane.post(f"/inbox/v1/feed/{items[0].id}/seen")
    jane.post(f"/inbox/v1/feed/{items[0].id}/seen")
    jane.post(f"/inbox/v1/feed/{items[0].id}/read")
    jane.post(f"/inbox/v1/feed/{items[0].id}/unread")
    jane.post(f"/inbox/v1/feed/{items[0].id}/read")  # a second read is no second event
    jane.post("/inbox/v1/feed/mark-all", {"state": "read"}, format="json")

    events = api_a.get(f"/api/v1/notifications/{first}").json()["events"]
    assert [e["type"] for e in events] == ["seen", "read"]
    assert events[0]["provider"] == "inbox"
    assert [e["type"] for e in api_a.get(f"/api/v1/notifications/{second}").json()["events"]] == ["seen", "read"]
    sent = sorted((e.type, str(e.payload["data"]["notification_id"])) for e in Event.objects.filter(tenant=tenant_a))
    assert sent == sorted([("notification.seen", first), ("notification.read", first),
                           ("notification.seen", second), ("notification.read", second)])  # fmt: skip
