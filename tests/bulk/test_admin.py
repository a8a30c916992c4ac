"""The console lists bulk sends with a progress bar and cancels them (audited); staff see only their
tenants' jobs."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from bulk import engine
from bulk.models import BulkSend
from core.management.commands.create_staff_user import operators_group
from core.models import AuditEvent, TenantMembership
from notifications.models import Notification
from tests.bulk.test_api import csv_text, upload

pytestmark = pytest.mark.django_db


def login(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


def staff(name: str, tenant) -> Client:  # noqa: ANN001
    user = get_user_model().objects.create_user(name, f"{name}@example.test", "pw-unused-123", is_staff=True)
    user.groups.add(operators_group())
    TenantMembership.objects.create(user=user, tenant=tenant)
    return login(user)


def test_jobs_show_progress_and_staff_cancel_them(api_a, setup_a, tenant_a, tenant_b):
    bulk = upload(api_a, csv_text(2500), name="outage notice").json()
    api_a.post(f"/api/v1/bulk-sends/{bulk['id']}/start")
    engine.run_chunk()
    Notification.objects.filter(bulk_row__lte=40).update(status="delivered")

    page = staff("ann", tenant_a).get("/admin/bulk/bulksend/").content.decode()
    assert "outage notice" in page and "<progress" in page
    assert "1,000 / 2,500 created · 40 delivered" in page
    assert "outage notice" not in staff("bob", tenant_b).get("/admin/bulk/bulksend/").content.decode()
    detail = staff("cid", tenant_a).get(f"/admin/bulk/bulksend/{bulk['id']}/change/")
    assert detail.status_code == 200 and "pending 960" in detail.content.decode()

    response = staff("dee", tenant_a).post(
        "/admin/bulk/bulksend/", {"action": "cancel_selected", "_selected_action": [bulk["id"]]}, follow=True
    )
    assert "Cancelled 1 bulk send" in response.content.decode()
    assert BulkSend.objects.get().status == "cancelled"
    assert AuditEvent.objects.get(action="bulk_send.cancelled").actor == "user:dee"
    assert engine.run_chunk().promoted == 0
    assert Notification.objects.count() == 1000


def test_another_tenants_staff_cannot_cancel(api_a, setup_a, tenant_b):
    bulk = upload(api_a, csv_text(3)).json()
    staff("bob", tenant_b).post("/admin/bulk/bulksend/", {"action": "cancel_selected",
                                                          "_selected_action": [bulk["id"]]})  # fmt: skip
    assert BulkSend.objects.get().status == "ready"


def test_invalid_jobs_list_their_errors(api_a, setup_a):
    bulk = upload(api_a, csv_text(5, bad={2, 4})).json()
    root = login(get_user_model().objects.create_superuser("root", "root@example.test", "pw-unused-123"))
    page = root.get(f"/admin/bulk/bulksend/{bulk['id']}/change/").content.decode()
    assert "user2.example.com" not in page  # messages say what is wrong, never the address
    assert "<td>2</td><td>recipient</td>" in page and "<td>4</td><td>recipient</td>" in page
