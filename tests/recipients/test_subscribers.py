"""Categories and subscribers: `general` always exists, any other category must;
subscribers by the tenant's external id, addresses encrypted and masked; notifications by subscriber
resolved at creation; opt-outs stored `suppressed` unless the category is critical; BOLA is 404."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.models import AuditEvent
from notifications.models import Notification
from queueing.models import QueueItem
from recipients import suppressions
from recipients.models import Category, Subscriber

pytestmark = pytest.mark.django_db

CANARY_MAIL = "canary.Zq81@example.net"
CANARY_PHONE = "+15557654321"
CANARY_TOKEN = "tok_canary_7f3b9a2c44d1"


def jane(**extra: object) -> dict:
    return {"email": CANARY_MAIL, "phone": CANARY_PHONE, "push_tokens": [CANARY_TOKEN, "tok_second_000011"],
            "timezone": "Europe/Berlin", **extra}  # fmt: skip


# --- categories -----------------------------------------------------------------------------------


def test_general_always_exists_is_patchable_never_critical_nor_deleted(api_a):
    listed = api_a.get("/api/v1/categories").json()["results"]
    assert [c["key"] for c in listed] == ["general"] and listed[0]["critical"] is False
    patched = api_a.patch("/api/v1/categories/general", {"description": "Everything",
                                                         "quiet_hours": {"start": "22:00", "end": "07:00"}},
                          format="json")  # fmt: skip
    assert patched.status_code == 200 and patched.json()["quiet_hours"] == {"start": "22:00", "end": "07:00"}
    assert api_a.patch("/api/v1/categories/general", {"critical": True}, format="json").status_code == 400
    assert api_a.delete("/api/v1/categories/general").status_code == 409
    assert api_a.patch("/api/v1/categories/general", {"quiet_hours": {"start": "25:00", "end": "07:00"}},
                       format="json").status_code == 400  # fmt: skip


def test_categories_are_created_patched_deleted_audited_and_scoped(api_a, api_b):
    made = api_a.post("/api/v1/categories", {"key": "security", "critical": True, "description": "Logins"},
                      format="json")  # fmt: skip
    assert made.status_code == 201 and made.json() == {
        "key": "security", "critical": True, "description": "Logins", "quiet_hours": None}
    assert api_a.post("/api/v1/categories", {"key": "security"}, format="json").status_code == 409
    assert api_a.post("/api/v1/categories", {"key": "bad key"}, format="json").status_code == 400
    assert api_b.get("/api/v1/categories/security").status_code == 404
    assert api_b.patch("/api/v1/categories/security", {"critical": False}, format="json").status_code == 404
    assert api_b.delete("/api/v1/categories/security").status_code == 404
    assert Category.objects.get(key="security").critical is True
    assert api_a.patch("/api/v1/categories/security", {"key": "other"}, format="json").status_code == 400
    assert api_a.delete("/api/v1/categories/security").status_code == 204
    actions = set(AuditEvent.objects.filter(target_type="recipients.category").values_list("action", flat=True))
    assert {"category.created", "category.deleted"} <= actions


def test_an_unknown_category_on_a_notification_is_400(api_a, setup_a):
    body = {"channel": "email", "recipient": "a@example.com", "body": "b", "category": "news"}
    response = api_a.post("/api/v1/notifications", body, format="json")
    assert response.status_code == 400 and "category" in response.json()["error"]["details"]
    api_a.post("/api/v1/categories", {"key": "news"}, format="json")
    created = api_a.post("/api/v1/notifications", body, format="json")
    assert created.status_code == 201 and created.json()["category"] == "news"
    plain = api_a.post("/api/v1/notifications", {**body, "category": None}, format="json").json()
    assert plain["category"] == "general"


# --- subscribers ----------------------------------------------------------------------------------


def test_put_creates_then_replaces_masked_and_encrypted(api_a):
    created = api_a.put("/api/v1/subscribers/user-42", jane(), format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["external_id"] == "user-42" and body["email_masked"] == "c***@example.net"
    assert body["phone_masked"] == "+1******4321" and body["push_tokens_masked"][0].endswith("44d1")
    text = created.content.decode()
    assert CANARY_MAIL.lower() not in text.lower() and CANARY_PHONE not in text and CANARY_TOKEN not in text
    replaced = api_a.put("/api/v1/subscribers/user-42", {"email": "new@example.com"}, format="json")
    assert replaced.status_code == 200
    assert replaced.json()["phone_masked"] == "" and replaced.json()["push_tokens_masked"] == []
    assert replaced.json()["timezone"] == ""
    with connection.cursor() as cursor:
        api_a.put("/api/v1/subscribers/user-43", jane(), format="json")
        cursor.execute("SELECT * FROM subscribers")
        dump = repr(cursor.fetchall()).lower()
    assert CANARY_MAIL.lower() not in dump and CANARY_PHONE[2:] not in dump and CANARY_TOKEN not in dump
    assert Subscriber.objects.get(external_id="user-43").push_tokens[0] == CANARY_TOKEN

    patched = api_a.patch("/api/v1/subscribers/user-43", {"timezone": "America/New_York"}, format="json")
    assert patched.status_code == 200 and patched.json()["timezone"] == "America/New_York"
    assert patched.json()["email_masked"] == "c***@example.net"
    assert [s["external_id"] for s in api_a.get("/api/v1/subscribers").json()["results"]] == ["user-43", "user-42"]
    assert api_a.delete("/api/v1/subscribers/user-43").status_code == 204
    assert api_a.get("/api/v1/subscribers/user-43").status_code == 404
    assert api_a.patch("/api/v1/subscribers/user-43", {"timezone": "UTC"}, format="json").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [({"email": "not-an-email"}, "email"), ({"phone": "555-1234"}, "phone"), ({"timezone": "Mars/Olympus"}, "timezone"),
     ({"push_tokens": "tok"}, "push_tokens"), ({"preferences": {"news": {"email": False}}}, "preferences"),
     ({"preferences": {"general": {"fax": False}}}, "preferences"),
     ({"preferences": {"general": {"email": "no"}}}, "preferences"), ({"name": "x"}, "name"),
     ({"external_id": "other"}, "external_id")],
)  # fmt: skip
def test_bad_subscriber_bodies_are_400(api_a, body, field):
    response = api_a.put("/api/v1/subscribers/u1", body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["details"], response.content
    assert not Subscriber.objects.exists()


def test_bulk_upsert_is_one_statement_and_all_or_nothing(api_a, tenant_a):
    api_a.put("/api/v1/subscribers/u0", {"email": "old@example.com"}, format="json")
    items = [{"external_id": f"u{i}", "email": f"user{i}@example.com", "preferences": {"general": {"sms": False}}}
             for i in range(1000)]  # fmt: skip
    with CaptureQueriesContext(connection) as ctx:
        response = api_a.put("/api/v1/subscribers", {"subscribers": items}, format="json")
    assert response.status_code == 200, response.content[:500]
    results = response.json()["results"]
    assert len(results) == 1000 and results[0] == {"external_id": "u0", "created": False}
    assert all(r["created"] for r in results[1:])
    upserts = [q for q in ctx.captured_queries if "INSERT INTO subscribers" in q["sql"]]
    assert len(upserts) == 1
    assert Subscriber.objects.for_tenant(tenant_a).count() == 1000
    assert Subscriber.objects.get(external_id="u0").email == "user0@example.com"

    bad = [{"external_id": "x1", "email": "x1@example.com"}, {"external_id": "x1"}, {"external_id": "x2", "phone": "1"}]
    response = api_a.put("/api/v1/subscribers", {"subscribers": bad}, format="json")
    assert response.status_code == 400
    assert set(response.json()["error"]["details"]["subscribers"]) == {"1", "2"}
    assert not Subscriber.objects.filter(external_id__in=["x1", "x2"]).exists()
    too_many = [{"external_id": f"y{i}"} for i in range(1001)]
    assert api_a.put("/api/v1/subscribers", {"subscribers": too_many}, format="json").status_code == 400


def test_another_tenants_subscribers_are_404_and_unchanged(api_a, api_b):
    api_a.put("/api/v1/subscribers/user-42", jane(), format="json")
    assert api_b.get("/api/v1/subscribers/user-42").status_code == 404
    assert api_b.patch("/api/v1/subscribers/user-42", {"timezone": "UTC"}, format="json").status_code == 404
    assert api_b.delete("/api/v1/subscribers/user-42").status_code == 404
    assert api_b.get("/api/v1/subscribers").json()["results"] == []
    # tenant B's PUT of the same external id is B's own subscriber
    assert api_b.put("/api/v1/subscribers/user-42", {"email": "b@example.com"}, format="json").status_code == 201
    assert api_a.get("/api/v1/subscribers/user-42").json()["timezone"] == "Europe/Berlin"
    # and a notification of B by that id goes to B's address
    assert Subscriber.objects.count() == 2


# --- notifications by subscriber ------------------------------------------------------------------


def test_a_notification_by_subscriber_takes_its_address_for_the_channel(api_a, setup_a):
    api_a.put("/api/v1/subscribers/user-42", jane(), format="json")
    for channel, expected in (("email", CANARY_MAIL), ("sms", CANARY_PHONE), ("push", CANARY_TOKEN)):
        response = api_a.post("/api/v1/notifications", {"channel": channel, "subscriber": "user-42", "body": "b"},
                              format="json")  # fmt: skip
        assert response.status_code == 201, response.content
        assert response.json()["subscriber"] == "user-42" and response.json()["status"] == "queued"
        assert Notification.objects.get(pk=response.json()["id"]).recipient == expected
    api_a.put("/api/v1/subscribers/no-phone", {"email": "x@example.com"}, format="json")
    cases = [
        ({"channel": "sms", "subscriber": "no-phone", "body": "b"}, "subscriber"),
        ({"channel": "email", "subscriber": "nobody", "body": "b"}, "subscriber"),
        ({"channel": "webhook", "subscriber": "user-42", "body": "b"}, "subscriber"),
        ({"channel": "email", "subscriber": "user-42", "recipient": "a@example.com", "body": "b"}, "subscriber"),
        ({"channel": "email", "body": "b"}, "recipient"),
    ]
    for body, field in cases:
        response = api_a.post("/api/v1/notifications", body, format="json")
        assert response.status_code == 400 and field in response.json()["error"]["details"], (body, response.content)
    batch = api_a.post("/api/v1/notifications/batch", {"notifications": [
        {"channel": "email", "subscriber": "user-42", "body": "b"},
        {"channel": "sms", "subscriber": "no-phone", "body": "b"}]}, format="json")  # fmt: skip
    assert batch.status_code == 400 and list(batch.json()["error"]["details"]["notifications"]) == ["1"]


def test_another_tenants_subscriber_is_unknown(api_a, api_b, setup_b):
    api_a.put("/api/v1/subscribers/user-42", jane(), format="json")
    response = api_b.post("/api/v1/notifications", {"channel": "email", "subscriber": "user-42", "body": "b"},
                          format="json")  # fmt: skip
    assert response.status_code == 400 and "subscriber" in response.json()["error"]["details"]


def test_opt_outs_suppress_at_creation_except_for_critical_categories(api_a, setup_a):
    api_a.post("/api/v1/categories", {"key": "news"}, format="json")
    api_a.post("/api/v1/categories", {"key": "security", "critical": True}, format="json")
    api_a.put("/api/v1/subscribers/user-42", jane(preferences={"news": {"email": False},
                                                                "security": {"email": False}}), format="json")

    def send(channel: str, category: str) -> str:
        response = api_a.post("/api/v1/notifications", {"channel": channel, "subscriber": "user-42", "body": "b",
                                                        "category": category}, format="json")  # fmt: skip
        assert response.status_code == 201, response.content
        return response.json()["status"]

    assert send("email", "news") == "suppressed"
    assert send("sms", "news") == "queued"  # the same category on SMS still goes
    assert send("email", "general") == "queued"
    assert send("email", "security") == "queued"  # critical: the opt-out is ignored
    assert QueueItem.objects.count() == 3
    # a suppressed address does not go, critical or not
    suppressions.suppress(setup_a.tenant.pk, "email", CANARY_MAIL, "complaint")
    assert send("email", "security") == "suppressed"
    assert send("email", "general") == "suppressed"


def test_a_batch_of_1000_by_subscriber_is_one_read_and_one_create(api_a, setup_a):
    items = [{"external_id": f"u{i}", "email": f"user{i}@example.com"} for i in range(1000)]
    assert api_a.put("/api/v1/subscribers", {"subscribers": items}, format="json").status_code == 200
    api_a.post("/api/v1/notifications", {"channel": "email", "recipient": "w@example.com", "body": "b"},
               format="json")  # warm: the tenant's configuration  # fmt: skip
    notes = [{"channel": "email", "subscriber": f"u{i}", "body": "b"} for i in range(1000)]
    with CaptureQueriesContext(connection) as ctx:
        response = api_a.post("/api/v1/notifications/batch", {"notifications": notes}, format="json")
    assert response.status_code == 201
    assert len(ctx.captured_queries) == 2, [q["sql"][:60] for q in ctx.captured_queries]  # subscribers, create
    assert Notification.objects.filter(subscriber="u999").get().recipient == "user999@example.com"


def test_the_console_shows_subscribers_and_categories_masked(admin_client, api_a):
    api_a.put("/api/v1/subscribers/user-42", jane(), format="json")
    api_a.get("/api/v1/categories")
    subscriber = Subscriber.objects.get()
    pages = [admin_client.get("/admin/recipients/subscriber/"),
             admin_client.get(f"/admin/recipients/subscriber/{subscriber.pk}/change/"),
             admin_client.get("/admin/recipients/category/")]  # fmt: skip
    for page in pages:
        assert page.status_code == 200
        text = page.content.decode().lower()
        assert CANARY_MAIL.lower() not in text and CANARY_PHONE[2:] not in text and CANARY_TOKEN not in text
    assert "c***@example.net" in pages[0].content.decode() and "general" in pages[2].content.decode()
