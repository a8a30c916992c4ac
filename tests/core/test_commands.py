"""Management commands: create_tenant, create_api_key, revoke_api_key, create_staff_user."""

from __future__ import annotations

import io
import json
import re
import time

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from core.models import ApiKey, AuditEvent, Tenant
from core.models.api_keys import KEY_RE
from tests.conftest import client_for
from tests.core.conftest import run_manage

pytestmark = pytest.mark.django_db


def call(*args: str, stdin: str | None = None, monkeypatch=None) -> str:  # noqa: ANN001
    out = io.StringIO()
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


# --- create_tenant ------------------------------------------------------------------------------


def test_create_tenant_prints_id_and_a_working_key_once():
    out = call("create_tenant", "Acme")
    tenant = Tenant.objects.get(name="Acme")
    assert f"tenant_id: {tenant.pk}" in out
    raw = re.search(r"api_key:\s+(\S+)", out)[1]
    assert KEY_RE.match(raw)
    assert client_for(raw).get("/api/v1/tenant").json() == {"id": str(tenant.pk), "name": "Acme"}
    assert ApiKey.objects.filter(tenant=tenant, test=False).count() == 1
    test_raw = re.search(r"test_api_key:\s+(\S+)", out)[1]
    assert test_raw.startswith("op_test_") and KEY_RE.match(test_raw)
    assert ApiKey.objects.filter(tenant=tenant, test=True).count() == 1
    assert AuditEvent.objects.filter(action="tenant.created", tenant=tenant).exists()


def test_create_tenant_json():
    data = json.loads(call("create_tenant", "Globex", "--json"))
    assert set(data) == {"tenant_id", "api_key", "test_api_key"}
    assert data["test_api_key"].startswith("op_test_")
    assert client_for(data["test_api_key"]).get("/api/v1/tenant").status_code == 200
    assert Tenant.objects.get(pk=data["tenant_id"]).name == "Globex"
    assert client_for(data["api_key"]).get("/api/v1/tenant").status_code == 200


@pytest.mark.parametrize(
    ("name", "message"),
    [("   ", "must not be empty"), ("x" * 201, "at most 200 characters")],
)
def test_create_tenant_rejects_bad_names(name, message):
    with pytest.raises(CommandError, match=message):
        call("create_tenant", name)
    assert not Tenant.objects.exists()


def test_create_tenant_rejects_a_duplicate_name(tenant_a):
    with pytest.raises(CommandError, match="already exists"):
        call("create_tenant", "tenant-a")
    assert Tenant.objects.count() == 1


# --- create_api_key / revoke_api_key ---------------------------------------------------------------


@pytest.mark.parametrize("ref", ["id", "name"])
def test_create_api_key_by_id_or_name(tenant_a, ref):
    data = json.loads(call("create_api_key", str(tenant_a.pk) if ref == "id" else tenant_a.name, "--json"))
    assert data["tenant_id"] == str(tenant_a.pk)
    assert client_for(data["api_key"]).get("/api/v1/tenant").json()["id"] == str(tenant_a.pk)
    assert AuditEvent.objects.filter(action="api_key.created", tenant=tenant_a).count() == 1


def test_create_api_key_plain_output_shows_the_key(tenant_a):
    raw = re.search(r"api_key:\s+(\S+)", call("create_api_key", "tenant-a"))[1]
    assert client_for(raw).get("/api/v1/tenant").status_code == 200


def test_create_api_key_for_unknown_tenant(tenant_a):
    for ref in ("nobody", "0b0c1c4e-0000-4000-8000-000000000000"):
        with pytest.raises(CommandError, match="no tenant with id or name"):
            call("create_api_key", ref)
    assert ApiKey.objects.count() == 0


@pytest.mark.parametrize("form", ["prefix", "op_prefix", "full key"])
def test_revoke_api_key(tenant_a, form):
    key, raw = ApiKey.issue(tenant_a)
    arg = {"prefix": key.prefix, "op_prefix": f"op_{key.prefix}", "full key": raw}[form]
    assert client_for(raw).get("/api/v1/tenant").status_code == 200
    out = call("revoke_api_key", arg)
    assert f"revoked op_{key.prefix}_" in out and raw not in out
    assert client_for(raw).get("/api/v1/tenant").status_code == 401
    assert AuditEvent.objects.filter(action="api_key.revoked", target_id=str(key.pk)).count() == 1
    with pytest.raises(CommandError, match="already revoked"):
        call("revoke_api_key", key.prefix)


def test_revoke_unknown_prefix():
    with pytest.raises(CommandError, match="no API key with prefix"):
        call("revoke_api_key", "ZZZZZZZZ")


# --- create_staff_user ------------------------------------------------------------------------------


def test_create_staff_user_with_password_from_stdin(tenant_a, tenant_b, monkeypatch):
    out = call(
        "create_staff_user",
        "olga",
        "--tenant",
        "tenant-a",
        "--password-stdin",
        stdin="c0rrect-h0rse\n",
        monkeypatch=monkeypatch,
    )
    assert "olga" in out and "tenant-a" in out
    user = get_user_model().objects.get(username="olga")
    assert user.is_staff and not user.is_superuser
    client = Client()
    assert client.login(username="olga", password="c0rrect-h0rse")
    html = client.get("/admin/core/tenant/").content.decode()
    assert "tenant-a" in html and "tenant-b" not in html
    assert client.get("/admin/core/apikey/").status_code == 200
    assert client.get("/admin/core/auditevent/").status_code == 200
    # the rooms' consoles: providers and templates (their own apps), notifications
    for page in ("/admin/providers/provider/", "/admin/templating/template/", "/admin/notifications/notification/"):
        assert client.get(page).status_code == 200, page
    assert client.get("/admin/recipients/suppression/").status_code == 403  # not an operator's


def test_create_staff_user_for_several_tenants_and_rerun(tenant_a, tenant_b, monkeypatch):
    call("create_staff_user", "pat", "--tenant", str(tenant_a.pk), "--tenant", "tenant-b")
    user = get_user_model().objects.get(username="pat")
    assert set(user.tenant_memberships.values_list("tenant__name", flat=True)) == {"tenant-a", "tenant-b"}
    assert not user.has_usable_password()
    # Running it again only adds what is missing.
    call("create_staff_user", "pat", "--tenant", "tenant-a")
    assert user.tenant_memberships.count() == 2


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["--tenant", "nobody"], None, "no tenant with id or name 'nobody'"),
        (["--tenant", "tenant-a", "--password-stdin"], "\n", "no password on standard input"),
        (["--tenant", "tenant-a", "--password-stdin"], "123\n", "password"),
    ],
)
def test_create_staff_user_bad_input(tenant_a, args, stdin, message, monkeypatch):
    with pytest.raises(CommandError, match=message):
        call("create_staff_user", "quinn", *args, stdin=stdin, monkeypatch=monkeypatch)
    assert not get_user_model().objects.filter(username="quinn").exists()


def test_create_staff_user_rejects_an_invalid_username(tenant_a):
    with pytest.raises(CommandError, match="username"):
        call("create_staff_user", "bad name!", "--tenant", "tenant-a")


# --- exit codes and one-line errors from the real command line ---------------------------------------


@pytest.mark.django_db(transaction=True)
def test_commands_exit_non_zero_with_one_readable_line(subprocess_env):
    created = run_manage("create_tenant", "cli-co", "--json", env=subprocess_env)
    assert created.returncode == 0, created.stderr
    data = json.loads(created.stdout)
    assert set(data) == {"tenant_id", "api_key", "test_api_key"}

    failures = {
        ("create_tenant", "cli-co"): "a tenant named 'cli-co' already exists",
        ("create_api_key", "ghost"): "no tenant with id or name 'ghost'",
        ("revoke_api_key", "ZZZZZZZZ"): "no API key with prefix 'ZZZZZZZZ'",
        ("create_staff_user", "sam", "--tenant", "ghost"): "no tenant with id or name 'ghost'",
    }
    for args, message in failures.items():
        result = run_manage(*args, env=subprocess_env)
        assert result.returncode != 0, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)

    staff = run_manage(
        "create_staff_user", "sam", "--tenant", "cli-co", "--password-stdin", env=subprocess_env, stdin="s3cret-pw-ok\n"
    )
    assert staff.returncode == 0, staff.stderr
    key = run_manage("create_api_key", data["tenant_id"], env=subprocess_env)
    assert key.returncode == 0 and "api_key: op_" in key.stdout
    revoke = run_manage("revoke_api_key", data["api_key"][3:11], env=subprocess_env)
    assert revoke.returncode == 0, revoke.stderr
    assert client_for(data["api_key"]).get("/api/v1/tenant").status_code == 401

    # test keys: issued with --test (--json prints the key alone), revoked by their prefix
    made = run_manage("create_api_key", "cli-co", "--test", "--json", env=subprocess_env)
    assert made.returncode == 0, made.stderr
    test_key = json.loads(made.stdout)["api_key"]
    assert test_key.startswith("op_test_") and KEY_RE.fullmatch(test_key)
    assert client_for(test_key).get("/api/v1/tenant").status_code == 200
    revoke = run_manage("revoke_api_key", test_key.removeprefix("op_test_")[:8], env=subprocess_env)
    assert revoke.returncode == 0 and revoke.stdout.strip() == f"revoked op_test_{test_key[8:16]}_…", revoke.stdout
    # revoked in another process: this one's cache (it saw the key) hears of it within a second
    deadline = time.monotonic() + 5
    while client_for(test_key).get("/api/v1/tenant").status_code != 401:
        assert time.monotonic() < deadline, "a revoked test key still authenticates after 5 s"
        time.sleep(0.05)
    again = run_manage("revoke_api_key", test_key, env=subprocess_env)  # the whole key names it too
    assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1
