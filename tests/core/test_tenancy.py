"""Tenant A never reads tenant B's rows: not through the scoped managers, the API, or the admin."""

from __future__ import annotations

import pytest

from core.models import ApiKey, AuditEvent, Tenant
from dlq.models import DeadLetter
from notifications.models import Notification
from providers.models import Provider
from tests.conftest import client_for
from tests.core.conftest import staff_client

pytestmark = pytest.mark.django_db


# --- managers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "attr"),
    [
        (Provider, "provider"),
        (Notification, "notification"),
        (DeadLetter, "dead_letter"),
        (ApiKey, "api_key"),
        (AuditEvent, "audit"),
    ],
)
def test_for_tenant_returns_only_that_tenants_rows(model, attr, rows_a, rows_b):
    a_row, b_row = getattr(rows_a, attr), getattr(rows_b, attr)
    assert model.objects.filter(pk__in=[a_row.pk, b_row.pk]).count() == 2  # both exist, unscoped
    for ref in (rows_a.tenant, rows_a.tenant.pk, str(rows_a.tenant.pk)):
        scoped = model.objects.for_tenant(ref)
        assert list(scoped.values_list("pk", flat=True)) == [a_row.pk]
        assert not scoped.filter(pk=b_row.pk).exists()
    assert list(model.objects.for_tenant(rows_b.tenant).values_list("pk", flat=True)) == [b_row.pk]


def test_named_filters_keep_the_tenant_scope(rows_a, rows_b):
    assert list(DeadLetter.objects.for_tenant(rows_a.tenant).open()) == [rows_a.dead_letter]
    assert list(ApiKey.objects.for_tenant(rows_a.tenant).active()) == [rows_a.api_key]


def test_for_tenant_refuses_none_instead_of_matching_unowned_rows(rows_a):
    # A system audit event has no tenant; `for_tenant(None)` must not turn into `tenant_id IS NULL`.
    AuditEvent.record(actor="system:test", action="system.event")
    with pytest.raises(ValueError, match="tenant"):
        AuditEvent.objects.for_tenant(None)


def test_visible_to_scopes_staff_and_not_superusers(rows_a, rows_b, django_user_model):
    staff = django_user_model.objects.create_user("member", is_staff=True)
    staff.tenant_memberships.create(tenant=rows_a.tenant)
    root = django_user_model.objects.create_superuser("root2")
    outsider = django_user_model.objects.create_user("outsider", is_staff=True)
    assert list(Notification.objects.visible_to(staff)) == [rows_a.notification]
    assert set(Notification.objects.visible_to(root)) == {rows_a.notification, rows_b.notification}
    assert not Notification.objects.visible_to(outsider).exists()


# --- API --------------------------------------------------------------------------------------


def test_each_key_sees_only_its_own_tenant(rows_a, rows_b):
    body_a = client_for(rows_a.raw_key).get("/api/v1/tenant").json()
    body_b = client_for(rows_b.raw_key).get("/api/v1/tenant").json()
    assert body_a == {"id": str(rows_a.tenant.pk), "name": rows_a.tenant.name}
    assert body_b == {"id": str(rows_b.tenant.pk), "name": rows_b.tenant.name}


def test_unknown_api_path_is_404_in_the_error_shape_not_403(rows_a):
    response = client_for(rows_a.raw_key).get(f"/api/v1/notifications-nope/{rows_a.notification.pk}")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "not_found"


# --- admin ------------------------------------------------------------------------------------

CHANGELISTS = {
    "apikey": lambda rows: str(rows.api_key),  # op_<prefix>_…
    "auditevent": lambda rows: rows.audit.action,
    "tenant": lambda rows: rows.tenant.name,
}


def _change_url(model: str, rows) -> str:  # noqa: ANN001
    obj = {"apikey": rows.api_key, "auditevent": rows.audit, "tenant": rows.tenant}[model]
    return f"/admin/core/{model}/{obj.pk}/change/"


@pytest.mark.parametrize("model", sorted(CHANGELISTS))
def test_staff_member_sees_only_their_tenant_in_the_admin(model, rows_a, rows_b, staff_a):
    page = staff_a.get(f"/admin/core/{model}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert CHANGELISTS[model](rows_a) in html
    assert CHANGELISTS[model](rows_b) not in html
    assert staff_a.get(_change_url(model, rows_a)).status_code == 200
    other = staff_a.get(_change_url(model, rows_b))
    assert other.status_code in (302, 404)
    if other.status_code == 302:
        assert other["Location"] == "/admin/"
    assert CHANGELISTS[model](rows_b) not in staff_a.get("/admin/", follow=True).content.decode()


@pytest.mark.parametrize("model", sorted(CHANGELISTS))
def test_superuser_sees_every_tenant_in_the_admin(model, rows_a, rows_b, superuser_client):
    html = superuser_client.get(f"/admin/core/{model}/").content.decode()
    assert CHANGELISTS[model](rows_a) in html
    assert CHANGELISTS[model](rows_b) in html
    assert superuser_client.get(_change_url(model, rows_b)).status_code == 200


def test_staff_member_of_no_tenant_sees_nothing(rows_a, rows_b):
    client = staff_client("nobody")
    for model in CHANGELISTS:
        html = client.get(f"/admin/core/{model}/").content.decode()
        assert CHANGELISTS[model](rows_a) not in html
        assert CHANGELISTS[model](rows_b) not in html


def test_staff_member_of_two_tenants_sees_both(rows_a, rows_b):
    client = staff_client("both", rows_a.tenant, rows_b.tenant)
    html = client.get("/admin/core/apikey/").content.decode()
    assert str(rows_a.api_key) in html and str(rows_b.api_key) in html


def test_staff_cannot_filter_their_way_into_another_tenant(rows_a, rows_b, staff_a):
    response = staff_a.get(f"/admin/core/apikey/?tenant__id__exact={rows_b.tenant.pk}", follow=True)
    assert str(rows_b.api_key) not in response.content.decode()


def test_view_only_staff_cannot_revoke_keys_through_the_action(rows_a, staff_a):
    response = staff_a.post(
        "/admin/core/apikey/", {"action": "revoke", "_selected_action": [rows_a.api_key.pk]}, follow=True
    )
    assert response.status_code == 200
    rows_a.api_key.refresh_from_db()
    assert rows_a.api_key.revoked_at is None


def test_superuser_revoke_action_revokes_and_audits(rows_a, superuser_client):
    superuser_client.post("/admin/core/apikey/", {"action": "revoke", "_selected_action": [rows_a.api_key.pk]})
    rows_a.api_key.refresh_from_db()
    assert rows_a.api_key.revoked_at is not None
    assert AuditEvent.objects.filter(action="api_key.revoked", target_id=str(rows_a.api_key.pk)).count() == 1
    assert client_for(rows_a.raw_key).get("/api/v1/tenant").status_code == 401


def test_admin_created_key_is_shown_once_and_stored_hashed(tenant_a, superuser_client):
    response = superuser_client.post("/admin/core/apikey/add/", {"tenant": tenant_a.pk, "name": "ops"}, follow=True)
    assert response.status_code == 200
    key = ApiKey.objects.get(name="ops")
    messages = [str(m) for m in response.context["messages"]]
    raw = next(m.split(": ", 1)[1] for m in messages if "shown once" in m)
    assert client_for(raw).get("/api/v1/tenant").json()["id"] == str(tenant_a.pk)
    assert raw not in superuser_client.get(f"/admin/core/apikey/{key.pk}/change/").content.decode()


def test_admin_key_cannot_be_moved_to_another_tenant_or_unrevoked(rows_a, tenant_b, superuser_client):
    rows_a.api_key.revoke()
    url = f"/admin/core/apikey/{rows_a.api_key.pk}/change/"
    superuser_client.post(url, {"tenant": tenant_b.pk, "name": "moved", "revoked_at_0": "", "revoked_at_1": ""})
    rows_a.api_key.refresh_from_db()
    assert rows_a.api_key.tenant_id == rows_a.tenant.pk
    assert rows_a.api_key.revoked_at is not None


def test_tenant_rows_are_404_for_staff_of_other_tenants_even_by_guessing(rows_a, tenant_b):
    client = staff_client("staff-b", tenant_b)
    assert Tenant.objects.count() == 2
    for url in (_change_url("apikey", rows_a), _change_url("auditevent", rows_a), _change_url("tenant", rows_a)):
        assert client.get(url).status_code in (302, 404)
