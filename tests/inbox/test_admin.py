"""Feed items in the console: read-only, filtered by tenant, state, category and subscriber, content
masked; staff see only their tenants' items."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from core.management.commands.create_staff_user import operators_group
from core.models import TenantMembership
from inbox.models import InboxItem

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 1, tzinfo=UTC)
EMAIL = "jane.doe@example.com"
PHONE = "+14155550123"


def login(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


def item(tenant, subscriber: str, title: str, n: int = 0, **fields: object) -> InboxItem:  # noqa: ANN001
    return InboxItem.objects.create(id=uuid.uuid4(), tenant=tenant, subscriber=subscriber, notification_id=uuid.uuid4(),
                                    title=title, created_at=T0 + timedelta(minutes=n), **fields)  # fmt: skip


def listed(client: Client, query: str = "") -> str:
    response = client.get(f"/admin/inbox/inboxitem/{query}")
    assert response.status_code == 200
    return response.content.decode()


def test_items_are_listed_and_filtered_per_tenant_state_and_subscriber(tenant_a, tenant_b):
    item(tenant_a, "jane", "jane-unread", 1)
    item(tenant_a, "jane", "jane-read", 2, seen_at=T0, read_at=T0, category="billing")
    item(tenant_a, "jane", "jane-archived", 3, archived_at=T0)
    item(tenant_a, "joe", "joe-unread", 4)
    item(tenant_b, "jane", "other-tenant", 5)
    root = login(get_user_model().objects.create_superuser("root", "root@example.test", "pw-unused-123"))

    def titles(query: str = "") -> set[str]:
        page = listed(root, query)
        return {t for t in ("jane-unread", "jane-read", "jane-archived", "joe-unread", "other-tenant") if t in page}

    assert titles() == {"jane-unread", "jane-read", "jane-archived", "joe-unread", "other-tenant"}
    assert titles(f"?tenant__id__exact={tenant_b.pk}") == {"other-tenant"}
    assert titles(f"?tenant__id__exact={tenant_a.pk}&q=jane") == {"jane-unread", "jane-read", "jane-archived"}
    assert titles("?state=unread") == {"jane-unread", "joe-unread", "other-tenant"}
    assert titles("?state=read") == {"jane-read"}
    assert titles("?state=archived") == {"jane-archived"}
    assert titles("?category=billing") == {"jane-read"}
    assert titles("?q=jan") == set()  # the exact external id, not a part of it

    one = InboxItem.objects.get(title="jane-read")
    assert root.get(f"/admin/inbox/inboxitem/{one.pk}/delete/").status_code == 403
    assert root.get("/admin/inbox/inboxitem/add/").status_code == 403
    detail = root.get(f"/admin/inbox/inboxitem/{one.pk}/change/").content.decode()
    assert f"/admin/notifications/notification/{one.notification_id}/change/" in detail
    assert 'name="_save"' not in detail  # read-only


def test_content_is_masked_in_the_list_and_the_detail(tenant_a):
    secret = "sk_live_0123456789abcdef"
    shown = item(tenant_a, "jane", f"Write to {EMAIL}", body=f"or call {PHONE}",
                 data={"api_key": secret, "contact": EMAIL}, action_url=f"https://x.example/?to={EMAIL}")  # fmt: skip
    root = login(get_user_model().objects.create_superuser("root", "root@example.test", "pw-unused-123"))
    pages = listed(root) + root.get(f"/admin/inbox/inboxitem/{shown.pk}/change/").content.decode()
    for raw in (EMAIL, PHONE, secret):
        assert raw not in pages
    assert "j***@example.com" in pages and "+1******0123" in pages
    assert "****cdef" in pages  # the secret-named data value, masked


def test_staff_see_only_their_tenants_items(tenant_a, tenant_b):
    mine = item(tenant_a, "jane", "tenant-a-item")
    theirs = item(tenant_b, "jane", "tenant-b-item")
    staff = get_user_model().objects.create_user("ann", "ann@example.test", "pw-unused-123", is_staff=True)
    staff.groups.add(operators_group())
    TenantMembership.objects.create(user=staff, tenant=tenant_a)
    client = login(staff)
    page = listed(client)
    assert "tenant-a-item" in page and "tenant-b-item" not in page
    assert client.get(f"/admin/inbox/inboxitem/{mine.pk}/change/").status_code == 200
    assert client.get(f"/admin/inbox/inboxitem/{theirs.pk}/change/").status_code in (302, 404)
