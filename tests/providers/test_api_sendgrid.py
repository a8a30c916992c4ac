"""The sendgrid kind through the providers API: config validated, api_key write-only, email only."""

from __future__ import annotations

import pytest

from providers.models import Provider
from tests.providers.test_sendgrid import API_KEY, FROM, PUBLIC_KEY

pytestmark = pytest.mark.django_db

PROVIDERS = "/api/v1/providers"


def body(**extra: object) -> dict:
    return {"name": "sg", "channel": "email", "kind": "sendgrid",
            "config": {"from_email": FROM, "public_key": PUBLIC_KEY, "base_url": "http://127.0.0.1:8025"},
            "secrets": {"api_key": API_KEY}, **extra}  # fmt: skip


def test_create_and_read_back_masked(api_a, tenant_a):
    response = api_a.post(PROVIDERS, body(), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["kind"] == "sendgrid"
    assert data["config"] == {"base_url": "http://127.0.0.1:8025", "from_email": FROM, "public_key": PUBLIC_KEY}
    assert data["secrets"] == {"api_key": "****" + API_KEY[-4:]}
    assert API_KEY not in api_a.get(f"{PROVIDERS}/sg").content.decode()
    assert Provider.objects.get(tenant=tenant_a, name="sg").secrets == {"api_key": API_KEY}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"channel": "sms"}, "channel"),
        ({"config": {"public_key": PUBLIC_KEY}}, "config"),
        ({"config": {"from_email": FROM, "public_key": "MFkw"}}, "config"),
        ({"secrets": {}}, "secrets"),
    ],
)
def test_invalid_sendgrid_provider_is_400(api_a, extra, field):
    response = api_a.post(PROVIDERS, body(**extra), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"]


def test_patching_the_public_key_keeps_the_api_key(api_a):
    assert api_a.post(PROVIDERS, body(config={"from_email": FROM}), format="json").status_code == 201
    response = api_a.patch(f"{PROVIDERS}/sg", {"config": {"from_email": FROM, "public_key": PUBLIC_KEY}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["config"]["public_key"] == PUBLIC_KEY
    assert Provider.objects.get(name="sg").secrets == {"api_key": API_KEY}
