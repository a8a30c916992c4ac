"""One service revokes a key and audits it: the admin action and `revoke_api_key` both call it,
each path writes exactly one `api_key.revoked` event, and a second revocation is an error. Issuing
a key is one service too (`api_key.created`), for the admin's add form and `create_api_key`."""

from __future__ import annotations

import io
import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from core import services
from core.models import ApiKey, AuditEvent
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def revoked_events(key: ApiKey) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action="api_key.revoked", target_id=str(key.pk)))


def test_the_service_revokes_once_and_audits_once(tenant_a):
    key, raw = ApiKey.issue(tenant_a)
    services.revoke_api_key(key, actor="user:ops")
    assert client_for(raw).get("/api/v1/tenant").status_code == 401
    [event] = revoked_events(key)
    assert (event.actor, event.tenant_id, event.target_type) == ("user:ops", tenant_a.pk, "core.apikey")

    with pytest.raises(services.ApiKeyAlreadyRevoked, match=rf"API key op_{key.prefix}_… was already revoked"):
        services.revoke_api_key(key, actor="user:ops")
    assert len(revoked_events(key)) == 1  # the failed second call wrote nothing


def test_the_command_path_writes_exactly_one_event_and_a_second_run_is_the_documented_error(tenant_a):
    key, _ = ApiKey.issue(tenant_a)
    call_command("revoke_api_key", key.prefix, stdout=io.StringIO())
    [event] = revoked_events(key)
    assert event.actor == "system:revoke_api_key"
    # README: `revoke_api_key` on an already revoked key is an error (exit 1).
    with pytest.raises(CommandError, match="already revoked"):
        call_command("revoke_api_key", key.prefix, stdout=io.StringIO())
    assert len(revoked_events(key)) == 1


def test_the_admin_path_writes_exactly_one_event_and_skips_an_already_revoked_key(tenant_a, superuser_client):
    fresh, _ = ApiKey.issue(tenant_a, name="fresh")
    old, _ = ApiKey.issue(tenant_a, name="old")
    services.revoke_api_key(old, actor="system:earlier")
    response = superuser_client.post(
        "/admin/core/apikey/", {"action": "revoke", "_selected_action": [fresh.pk, old.pk]}, follow=True
    )
    assert "Revoked 1 key(s)." in [str(m) for m in response.context["messages"]]
    [event] = revoked_events(fresh)
    assert event.actor == "user:root"
    assert [e.actor for e in revoked_events(old)] == ["system:earlier"]


def test_neither_path_writes_its_own_revocation():
    """The admin action and the command only call the service (STYLE.md 3)."""
    from pathlib import Path

    from django.conf import settings

    for path in ("core/admin.py", "core/management/commands/revoke_api_key.py"):
        source = (Path(settings.BASE_DIR) / path).read_text()
        assert "api_key.revoked" not in source and ".revoke()" not in source, path
        assert "services.revoke_api_key" in source, path


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_revocations_audit_once(tenant_a):
    key, _ = ApiKey.issue(tenant_a)
    barrier, outcomes = threading.Barrier(2), []

    def revoke() -> None:
        try:
            barrier.wait(timeout=5)
            services.revoke_api_key(ApiKey.objects.get(pk=key.pk), actor="user:racer")
            outcomes.append("revoked")
        except services.ApiKeyAlreadyRevoked:
            outcomes.append("already")
        finally:
            connection.close()

    threads = [threading.Thread(target=revoke) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(outcomes) == ["already", "revoked"]
    assert len(revoked_events(key)) == 1


def test_issuing_writes_one_created_event_from_the_admin_and_from_the_command(tenant_a, superuser_client):
    superuser_client.post("/admin/core/apikey/add/", {"tenant": tenant_a.pk, "name": "from-admin"})
    call_command("create_api_key", tenant_a.name, "--name", "from-command", stdout=io.StringIO())
    for name, actor in (("from-admin", "user:root"), ("from-command", "system:create_api_key")):
        key = ApiKey.objects.get(name=name)
        events = AuditEvent.objects.filter(action="api_key.created", target_id=str(key.pk))
        assert [(e.actor, e.tenant_id) for e in events] == [(actor, tenant_a.pk)], name
