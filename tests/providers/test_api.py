"""`providers/{name}`: a tenant's providers through the API: secrets write-only, defaults, limits,
identity fixed, deletion kept while notifications use them."""

from __future__ import annotations

import pytest
from django.db import connection

from core.models import AuditEvent
from providers.models import Provider
from queueing.models import RateBucket
from tests.support.setups import WHSEC, email

pytestmark = pytest.mark.django_db

PROVIDERS = "/api/v1/providers"


def hook(**extra: object) -> dict:
    return {"name": "out", "channel": "webhook", "kind": "webhook", "config": {"url": "http://127.0.0.1:8080/in"},
            "secrets": {"signing_secret": WHSEC}, **extra}  # fmt: skip


def test_provider_secrets_are_write_only_and_encrypted(api_a, tenant_a):
    response = api_a.post(PROVIDERS, hook(), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["secrets"] == {"signing_secret": "****" + WHSEC[-4:]}
    assert data["config"] == {"url": "http://127.0.0.1:8080/in", "timeout_seconds": 10.0}  # normalised
    assert WHSEC not in response.content.decode()
    assert WHSEC not in api_a.get(f"{PROVIDERS}/out").content.decode()
    with connection.cursor() as cursor:
        cursor.execute("SELECT secrets FROM providers WHERE name = 'out'")
        assert WHSEC not in cursor.fetchone()[0]
    assert Provider.objects.get(name="out").secrets == {"signing_secret": WHSEC}
    event = AuditEvent.objects.get(action="provider.created")
    assert WHSEC not in str(event.details)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (hook(config={}), "config"),
        (hook(config={"url": "ftp://x"}), "config"),
        (hook(config={"url": "http://x", "extra": 1}), "config"),
        (hook(secrets={}), "secrets"),
        (hook(secrets={"signing_secret": "plain"}), "secrets"),
        (hook(secrets={"signing_secret": 5}), "secrets"),
        (hook(channel="email"), "channel"),
        (hook(kind="pigeon"), "kind"),
        (hook(name="has space"), "name"),
        (hook(rate_limit={"rate_per_second": 0}), "rate_limit"),
        (hook(rate_limit={"rate_per_second": 5, "extra": 1}), "rate_limit"),
        (hook(max_attempts=0), "max_attempts"),
        (hook(tenant="other"), "tenant"),
        (hook(effective_rate_per_second=9), "effective_rate_per_second"),
    ],
)
def test_provider_validation(api_a, tenant_a, body, field):
    response = api_a.post(PROVIDERS, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"]
    assert not Provider.objects.exists()


def test_a_new_default_unsets_the_old_one(api_a, setup_a):
    response = api_a.post(PROVIDERS, hook(is_default=True), format="json")
    assert response.status_code == 201 and response.json()["is_default"] is True
    defaults = Provider.objects.filter(tenant=setup_a.tenant, channel="webhook", is_default=True)
    assert list(defaults.values_list("name", flat=True)) == ["out"]
    assert api_a.patch(f"{PROVIDERS}/hook", {"is_default": True}, format="json").json()["is_default"] is True
    assert list(defaults.values_list("name", flat=True)) == ["hook"]
    assert Provider.objects.get(tenant=setup_a.tenant, name="mail").is_default  # other channels untouched


def test_rate_limit_and_effective_rate(api_a, tenant_a):
    data = api_a.post(PROVIDERS, hook(rate_limit={"rate_per_second": 5, "burst": 10}), format="json").json()
    assert data["rate_limit"] == {"rate_per_second": 5.0, "burst": 10}
    assert data["effective_rate_per_second"] == 5.0
    provider = Provider.objects.get(name="out")
    RateBucket.objects.create(key=f"provider:{provider.pk}", rate=5, effective_rate=3.5, burst=10, tokens=0)
    assert api_a.get(f"{PROVIDERS}/out").json()["effective_rate_per_second"] == 3.5
    assert api_a.get(PROVIDERS).json()["results"][0]["effective_rate_per_second"] == 3.5
    cleared = api_a.patch(f"{PROVIDERS}/out", {"rate_limit": None}, format="json").json()
    assert cleared["rate_limit"] is None
    provider.refresh_from_db()
    assert provider.rate_per_second is None and provider.burst is None


def test_patch_keeps_secrets_and_refuses_identity_changes(api_a, tenant_a):
    api_a.post(PROVIDERS, hook(), format="json")
    response = api_a.patch(f"{PROVIDERS}/out", {"config": {"url": "http://127.0.0.1:9/new"}, "max_attempts": 3},
                           format="json")  # fmt: skip
    assert response.status_code == 200, response.content
    provider = Provider.objects.get(name="out")
    assert provider.config["url"] == "http://127.0.0.1:9/new" and provider.max_attempts == 3
    assert provider.secrets == {"signing_secret": WHSEC}
    for change in ({"name": "renamed"}, {"channel": "push"}, {"kind": "console"}):
        response = api_a.patch(f"{PROVIDERS}/out", change, format="json")
        assert response.status_code == 400 and set(response.json()["error"]["details"]) == set(change)
    assert api_a.patch(f"{PROVIDERS}/out", {"name": "out"}, format="json").status_code == 200  # unchanged is fine
    assert api_a.put(f"{PROVIDERS}/out", hook(), format="json").status_code == 405


def test_duplicate_provider_name_is_409(api_a, tenant_a):
    assert api_a.post(PROVIDERS, hook(), format="json").status_code == 201
    response = api_a.post(PROVIDERS, hook(), format="json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "already_exists"


def test_delete_provider(api_a, setup_a):
    api_a.post("/api/v1/notifications", email(), format="json")
    response = api_a.delete(f"{PROVIDERS}/mail")
    assert response.status_code == 409 and response.json()["error"]["code"] == "provider_in_use"
    assert api_a.delete(f"{PROVIDERS}/text").status_code == 204
    assert not Provider.objects.filter(name="text").exists()
    assert AuditEvent.objects.filter(action="provider.deleted").count() == 1
    assert api_a.delete(f"{PROVIDERS}/text").status_code == 404


def test_deleting_a_provider_never_reads_the_attempts_table(api_a, setup_a):
    """An attempt's provider is its notification's, which protects it: deleting a provider has no
    attempt to change, and must not scan delivery_attempts (unindexed by provider) to find none."""
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        assert api_a.delete(f"{PROVIDERS}/text").status_code == 204
    assert not [q["sql"] for q in ctx.captured_queries if "delivery_attempts" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'delivery_attempts'")
        assert not [d for (d,) in cursor.fetchall() if "provider_id" in d]
