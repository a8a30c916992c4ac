"""The suppression list (recipients.suppressions, `GET/POST/DELETE suppressions`, the admin): one
entry per tenant, channel, address and category, found by a keyed blind index (never by decrypting
the table), recomputed by key rotation; added and removed audited; another tenant's entries are 404."""

from __future__ import annotations

import io

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from core.models import AuditEvent
from recipients import suppressions
from recipients.models import Suppression

pytestmark = pytest.mark.django_db

URL = "/api/v1/suppressions"
OLD = settings.OMNIPOST_ENCRYPTION_KEYS[0]
CANARY = "canary.7Qx2@example.org"


def test_suppress_is_idempotent_per_tenant_channel_address_and_category(tenant_a, tenant_b):
    entry, created = suppressions.suppress(tenant_a.pk, "email", "Jane.Doe@Example.com ", "hard_bounce")
    assert created and entry.recipient_masked == "j***@example.com" and entry.category is None
    again, created = suppressions.suppress(tenant_a.pk, "email", "jane.doe@example.com", "complaint")
    assert not created and again.pk == entry.pk and again.reason == "hard_bounce"
    # another category, another channel, another tenant: other entries
    scoped, created = suppressions.suppress(tenant_a.pk, "email", "jane.doe@example.com", "unsubscribed", "news")
    assert created and scoped.pk != entry.pk
    assert suppressions.suppress(tenant_a.pk, "email", "jane.doe@example.com", "manual", "news")[1] is False
    assert suppressions.suppress(tenant_a.pk, "sms", "+1 (555) 123-4567", "manual")[1] is True
    assert suppressions.suppress(tenant_a.pk, "sms", "+15551234567", "manual")[1] is False
    assert suppressions.suppress(tenant_b.pk, "email", "jane.doe@example.com", "manual")[1] is True
    assert Suppression.objects.for_tenant(tenant_a).count() == 3
    with pytest.raises(ValueError, match="email and sms addresses only"):
        suppressions.suppress(tenant_a.pk, "push", "tok_abc", "hard_bounce")


def test_a_batch_is_one_insert_and_reports_what_it_created(tenant_a, tenant_b):
    suppressions.suppress(tenant_a.pk, "email", "old@example.com", "manual")
    seen: list[list[Suppression]] = []
    suppressions.on_suppressed(seen.append)
    try:
        entries = [
            suppressions.Entry(tenant_a.pk, "email", "old@example.com", "hard_bounce"),  # exists
            suppressions.Entry(tenant_a.pk, "email", "new@example.com", "hard_bounce", None, "0" * 32),
            suppressions.Entry(tenant_a.pk, "email", "NEW@example.com", "complaint"),  # duplicate in the batch
            suppressions.Entry(tenant_b.pk, "sms", "+15550001111", "complaint"),
            suppressions.Entry(tenant_b.pk, "push", "tok_1234", "complaint"),  # not an address: skipped
        ]
        with CaptureQueriesContext(connection) as ctx:
            created = suppressions.suppress_many(entries)
    finally:
        suppressions._callbacks.remove(seen.append)
    inserts = [q["sql"] for q in ctx.captured_queries if "suppressions" in q["sql"]]
    assert len(inserts) == 1, inserts
    assert [(c.tenant_id, c.channel, c.recipient_masked) for c in created] == [
        (tenant_a.pk, "email", "n***@example.com"), (tenant_b.pk, "sms", "+1******1111"),
    ]  # fmt: skip
    assert str(created[0].source_notification_id) == "00000000-0000-0000-0000-000000000000"
    assert created[0].created_at is not None
    assert seen == [created]
    assert Suppression.objects.count() == 3


def test_the_table_holds_no_address_in_clear(tenant_a):
    suppressions.suppress(tenant_a.pk, "email", CANARY, "manual")
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM suppressions")
        dump = repr(cursor.fetchall())
    assert CANARY not in dump and CANARY.lower() not in dump and "canary" not in dump.lower()
    assert Suppression.objects.get().recipient == CANARY.lower()


def test_the_blind_index_is_keyed(tenant_a):
    entry, _ = suppressions.suppress(tenant_a.pk, "email", CANARY, "manual")
    import hashlib

    assert entry.recipient_index != hashlib.sha256(CANARY.lower().encode()).hexdigest()
    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[Fernet.generate_key().decode()]):
        assert suppressions.indexes("email", CANARY)[0] != entry.recipient_index


def test_lookups_survive_a_key_rotation(tenant_a):
    kept, _ = suppressions.suppress(tenant_a.pk, "email", "jane@example.com", "manual")
    suppressions.suppress(tenant_a.pk, "sms", "+15551234567", "manual")
    new = Fernet.generate_key().decode()
    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[new, OLD]):
        # before rotation: found under the older key, and not added twice
        assert list(suppressions.matching(tenant_a.pk, "JANE@example.com")) == [kept]
        assert suppressions.suppress(tenant_a.pk, "email", "jane@example.com", "manual")[1] is False
        # suppressed again while the old index stands, by an older version writing the new one: a twin
        twin = Suppression.objects.create(
            tenant=tenant_a, channel="sms", recipient="+15551234567", recipient_masked="x", reason="manual",
            recipient_index=suppressions.indexes("sms", "+15551234567")[0],
        )  # fmt: skip
        call_command("rotate_encryption_keys", stdout=io.StringIO(), stderr=io.StringIO())
    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[new]):
        assert [s.pk for s in suppressions.matching(tenant_a.pk, "jane@example.com", "email")] == [kept.pk]
        assert [s.pk for s in suppressions.matching(tenant_a.pk, "+15551234567")] == [twin.pk]
        assert Suppression.objects.count() == 2
        assert Suppression.objects.get(pk=kept.pk).recipient == "jane@example.com"


# --- API ------------------------------------------------------------------------------------------


def test_api_adds_lists_finds_and_removes_masked_and_audited(api_a):
    response = api_a.post(URL, {"channel": "email", "recipient": "Jane@Example.com"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["recipient_masked"] == "j***@example.com" and body["reason"] == "manual"
    assert body["category"] is None and "recipient" not in body
    again = api_a.post(URL, {"channel": "email", "recipient": "jane@example.com"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    api_a.post(URL, {"channel": "email", "recipient": "jane@example.co"}, format="json")
    api_a.post(URL, {"channel": "sms", "recipient": "+15551234567", "reason": "complaint"}, format="json")

    found = api_a.get(URL, {"recipient": " JANE@example.com"}).json()["results"]
    assert [r["id"] for r in found] == [body["id"]]
    assert api_a.get(URL, {"recipient": "jane@example.c"}).json()["results"] == []
    assert len(api_a.get(URL).json()["results"]) == 3
    assert [r["channel"] for r in api_a.get(URL, {"channel": "sms"}).json()["results"]] == ["sms"]
    listing = api_a.get(URL).content.decode()
    assert "jane@example" not in listing.lower() and "5551234567" not in listing
    assert AuditEvent.objects.filter(action="suppression.created", target_id=body["id"]).count() == 1

    assert api_a.delete(f"{URL}/{body['id']}").status_code == 204
    assert api_a.get(URL, {"recipient": "jane@example.com"}).json()["results"] == []
    event = AuditEvent.objects.get(action="suppression.deleted", target_id=body["id"])
    assert event.details["recipient_masked"] == "j***@example.com"
    assert api_a.delete(f"{URL}/{body['id']}").status_code == 404


def test_api_refuses_bad_input(api_a):
    bad = [
        ({"channel": "email", "recipient": "not-an-address"}, "recipient"),
        ({"channel": "fax", "recipient": "x"}, "channel"),
        ({"channel": "push", "recipient": "tok_1234", "reason": "hard_bounce"}, "reason"),
        ({"channel": "email", "recipient": "a@example.com", "reason": "spam"}, "reason"),
        ({"channel": "email", "recipient": "a@example.com", "tenant": "x"}, "tenant"),
    ]
    for payload, field in bad:
        response = api_a.post(URL, payload, format="json")
        assert response.status_code == 400 and field in response.json()["error"]["details"], (payload, response.content)
    assert api_a.get(URL, {"channel": "fax"}).status_code == 400
    assert api_a.get(URL, {"address": "x"}).status_code == 400
    assert not Suppression.objects.exists()


def test_another_tenants_entries_are_404_and_unchanged(api_a, api_b, tenant_a):
    mine, _ = suppressions.suppress(tenant_a.pk, "email", "jane@example.com", "manual")
    assert api_b.get(f"{URL}/{mine.pk}").status_code == 404
    assert api_b.delete(f"{URL}/{mine.pk}").status_code == 404
    assert api_b.get(URL, {"recipient": "jane@example.com"}).json()["results"] == []
    assert api_b.get(URL).json()["results"] == []
    assert Suppression.objects.filter(pk=mine.pk).exists()
    assert api_a.get(f"{URL}/{mine.pk}").json()["recipient_masked"] == "j***@example.com"


# --- admin ----------------------------------------------------------------------------------------


@pytest.fixture
def staff_a(tenant_a, django_user_model, client):  # noqa: ANN001, ANN201
    from django.contrib.auth.models import Permission

    from core.models import TenantMembership

    user = django_user_model.objects.create_user("ops", password="pw-ops-1234", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__endswith="_suppression"))
    TenantMembership.objects.create(user=user, tenant=tenant_a)
    client.force_login(user)
    return client


def test_admin_adds_searches_and_removes_masked_and_audited(staff_a, tenant_a, tenant_b):
    suppressions.suppress(tenant_b.pk, "email", "other@example.com", "manual")
    response = staff_a.post(
        "/admin/recipients/suppression/add/",
        {"tenant": str(tenant_a.pk), "channel": "email", "address": CANARY, "reason": "manual", "category": ""},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    entry = Suppression.objects.for_tenant(tenant_a).get()
    assert entry.recipient == CANARY.lower()
    assert AuditEvent.objects.filter(action="suppression.created", actor="user:ops", target_id=str(entry.pk)).exists()

    page = staff_a.get("/admin/recipients/suppression/", {"q": CANARY.upper()}).content.decode()
    assert "c***@example.org" in page and page.lower().count(CANARY.lower()) == 1  # the search box only
    assert "o***@example.com" not in staff_a.get("/admin/recipients/suppression/").content.decode()
    assert CANARY.lower() not in staff_a.get(f"/admin/recipients/suppression/{entry.pk}/change/").content.decode()

    response = staff_a.post(f"/admin/recipients/suppression/{entry.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Suppression.objects.for_tenant(tenant_a).exists()
    assert AuditEvent.objects.filter(action="suppression.deleted", actor="user:ops").count() == 1


def test_a_category_scoped_entry_names_an_existing_category(api_a):
    body = {"channel": "email", "recipient": "a@example.com", "category": "news"}
    response = api_a.post(URL, body, format="json")
    assert response.status_code == 400 and "category" in response.json()["error"]["details"]
    api_a.post("/api/v1/categories", {"key": "news"}, format="json")
    made = api_a.post(URL, body, format="json")
    assert made.status_code == 201 and made.json()["category"] == "news"
