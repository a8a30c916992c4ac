"""The audit log is append-only: through the ORM, the admin, and raw SQL on PostgreSQL."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test import RequestFactory

from core.models import AuditEvent, AuditLogIsAppendOnly

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(tenant_a) -> AuditEvent:  # noqa: ANN001
    return AuditEvent.record(actor="user:ops", action="tenant.created", target=tenant_a, tenant=tenant_a)


@pytest.fixture
def without_db_trigger():  # noqa: ANN201
    """Disable the PostgreSQL trigger for this test's transaction, so the ORM guard is tested on its own."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete")
    yield  # DDL is transactional in PostgreSQL: the test's rollback re-enables the trigger


def _unchanged(event: AuditEvent) -> None:
    stored = AuditEvent.objects.get(pk=event.pk)
    assert (stored.actor, stored.action, stored.target_id) == (event.actor, event.action, event.target_id)


def test_orm_refuses_instance_save_and_delete(event, without_db_trigger):
    event.action = "tenant.rewritten"
    with pytest.raises(AuditLogIsAppendOnly):
        event.save()
    with pytest.raises(AuditLogIsAppendOnly):
        event.delete()
    assert AuditEvent.objects.get(pk=event.pk).action == "tenant.created"


def test_orm_refuses_queryset_update_and_delete(event, without_db_trigger):
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEvent.objects.filter(pk=event.pk).update(action="x")
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEvent.objects.all().delete()
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEvent.objects.for_tenant(event.tenant_id).delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_orm_refuses_bulk_update(event, without_db_trigger):
    event.action = "x"
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEvent.objects.bulk_update([event], ["action"])
    assert AuditEvent.objects.get(pk=event.pk).action == "tenant.created"


def test_orm_refuses_overwriting_by_primary_key(event, without_db_trigger):
    """A fresh instance carrying an existing pk must not turn into an UPDATE."""
    forged = AuditEvent(pk=event.pk, actor="user:mallory", action="nothing.happened", target_type="x", target_id="1")
    with pytest.raises((AuditLogIsAppendOnly, IntegrityError)), transaction.atomic():
        forged.save()
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.actor == "user:ops" and stored.action == "tenant.created"


def test_orm_refuses_upserts(event, without_db_trigger):
    forged = AuditEvent(pk=event.pk, actor="user:mallory", action="x", target_type="x", target_id="1")
    with pytest.raises(AuditLogIsAppendOnly), transaction.atomic():
        AuditEvent.objects.bulk_create(
            [forged], update_conflicts=True, unique_fields=["id"], update_fields=["actor", "action"]
        )
    assert AuditEvent.objects.get(pk=event.pk).actor == "user:ops"


def test_appending_still_works(tenant_a):
    AuditEvent.record(actor="system:test", action="a", tenant=tenant_a)
    AuditEvent.bulk_record([AuditEvent(actor="system:test", action="b", target_type="t", target_id="1")])
    assert sorted(AuditEvent.objects.values_list("action", flat=True)) == ["a", "b"]


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE audit_events SET action = 'x' WHERE id = %s",
        "DELETE FROM audit_events WHERE id = %s",
    ],
)
def test_raw_sql_update_and_delete_are_refused_by_postgres(event, sql):
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [event.pk])
    _unchanged(event)


def test_raw_truncate_is_refused_unless_the_database_allows_it(event):
    with pytest.raises(DatabaseError, match="TRUNCATE refused"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL omnipost.allow_audit_truncate = off")
            cursor.execute("TRUNCATE audit_events")
    _unchanged(event)
    with connection.cursor() as cursor:  # the test database's own setting is untouched
        cursor.execute("SELECT current_setting('omnipost.allow_audit_truncate', true)")
        assert cursor.fetchone()[0] == "on"


def test_triggers_are_installed():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'audit_events'::regclass AND NOT tgisinternal"
            " AND tgenabled <> 'D' ORDER BY tgname"
        )
        names = [row[0] for row in cursor.fetchall()]
    assert names == ["audit_events_no_truncate", "audit_events_no_update_delete"]


# --- admin ------------------------------------------------------------------------------------


def test_admin_grants_no_add_change_or_delete(event, django_user_model):
    model_admin = admin.site._registry[AuditEvent]
    request = RequestFactory().get("/admin/core/auditevent/")
    request.user = django_user_model.objects.create_superuser("root3")
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request, event)
    assert not model_admin.has_delete_permission(request, event)
    assert model_admin.has_view_permission(request, event)
    assert "delete_selected" not in model_admin.get_actions(request)


def test_admin_delete_and_change_posts_fail_even_for_a_superuser(event, superuser_client):
    base = f"/admin/core/auditevent/{event.pk}"
    assert superuser_client.post(f"{base}/delete/", {"post": "yes"}).status_code == 403
    assert superuser_client.post(f"{base}/change/", {"action": "tenant.rewritten"}).status_code == 403
    assert superuser_client.post("/admin/core/auditevent/add/", {"action": "x"}).status_code == 403
    response = superuser_client.post(
        "/admin/core/auditevent/", {"action": "delete_selected", "_selected_action": [event.pk], "post": "yes"}
    )
    assert response.status_code in (200, 302)
    _unchanged(event)
    html = superuser_client.get(f"{base}/change/").content.decode()
    assert "tenant.created" in html and 'name="_save"' not in html and "/delete/" not in html
