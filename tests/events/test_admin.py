"""The event endpoint console: secret masked, attempts read-only, enabling audited, tenant-scoped."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from core.models import AuditEvent, TenantMembership
from events.models import EventAttempt, EventEndpoint
from events.services import create_endpoint
from tests.support.receivers import TEST_SIGNING_SECRET

pytestmark = pytest.mark.django_db

SECRET_PART = TEST_SIGNING_SECRET[6:20]


def _endpoint(tenant, name="ops"):
    endpoint, _ = create_endpoint(tenant, name=name, url="http://127.0.0.1:9/x", event_types=["*"], actor="test",
                                  secret=TEST_SIGNING_SECRET)  # fmt: skip
    return endpoint


def test_list_and_change_pages_mask_the_secret_and_show_attempts(tenant_a):
    endpoint = _endpoint(tenant_a)
    EventAttempt.objects.create(tenant=tenant_a, event_id=uuid.uuid4(), endpoint=endpoint,
                                event_type="notification.failed", status="failed", http_status=503, duration_ms=7,
                                attempted_at=timezone.now())  # fmt: skip
    admin = get_user_model().objects.create_superuser("root", "root@example.test", "pw-unused-123")
    client = Client()
    client.force_login(admin)
    listing = client.get("/admin/events/eventendpoint/")
    assert listing.status_code == 200 and "ops" in listing.content.decode()
    detail = client.get(f"/admin/events/eventendpoint/{endpoint.pk}/change/").content.decode()
    assert SECRET_PART not in detail and "****" in detail and "HTTP 503" in detail
    response = client.post(f"/admin/events/eventendpoint/{endpoint.pk}/change/", {"enabled": ""})
    assert response.status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.enabled is False
    assert AuditEvent.objects.filter(action="event_endpoint.updated", actor="user:root").exists()


def test_staff_see_only_their_tenants_endpoints(tenant_a, tenant_b):
    _endpoint(tenant_a, "mine")
    theirs = _endpoint(tenant_b, "theirs")
    staff = get_user_model().objects.create_user("staff", "s@example.test", "pw-unused-123", is_staff=True)
    from django.contrib.auth.models import Permission

    staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="events"))
    TenantMembership.objects.create(user=staff, tenant=tenant_a)
    client = Client()
    client.force_login(staff)
    page = client.get("/admin/events/eventendpoint/").content.decode()
    assert "mine" in page and "theirs" not in page
    assert client.get(f"/admin/events/eventendpoint/{theirs.pk}/change/").status_code in (302, 404)
    assert EventEndpoint.objects.get(pk=theirs.pk).enabled is True
