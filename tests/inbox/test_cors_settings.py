"""Tenant settings (`GET/PATCH settings`, origins validated) and CORS on /inbox/v1/: a preflight is
answered for an origin some tenant allows; a token-bearing request is granted only for its token's
tenant's origins; other origins get no grant, and the tenant API grants none."""

from __future__ import annotations

import pytest

from tests.conftest import client_for
from tests.inbox.support import subscriber

pytestmark = pytest.mark.django_db

APP = "https://app.example.com"


def allow(api, *origins: str) -> None:  # noqa: ANN001
    made = api.patch("/api/v1/settings", {"inbox_allowed_origins": list(origins)}, format="json")
    assert made.status_code == 200, made.content


def test_settings_round_trip_and_validation(api_a, api_b):
    assert api_a.get("/api/v1/settings").json() == {"inbox_allowed_origins": []}
    given = ["https://App.Example.com", APP, "http://localhost:3000"]
    made = api_a.patch("/api/v1/settings", {"inbox_allowed_origins": given}, format="json")
    assert made.json() == {"inbox_allowed_origins": [APP, "http://localhost:3000"]}
    assert api_a.get("/api/v1/settings").json() == {"inbox_allowed_origins": [APP, "http://localhost:3000"]}
    assert api_b.get("/api/v1/settings").json() == {"inbox_allowed_origins": []}
    for bad in ("*", "app.example.com", "https://app.example.com/", "https://app.example.com/x", "ftp://a.b",
                "https://u@a.b", "https://a.b?x=1", "https://a.b:99999", 3, ""):  # fmt: skip
        refused = api_a.patch("/api/v1/settings", {"inbox_allowed_origins": [bad]}, format="json")
        assert refused.status_code == 400, bad
        assert "inbox_allowed_origins" in refused.json()["error"]["details"]
    assert api_a.patch("/api/v1/settings", {"inbox_allowed_origins": APP}, format="json").status_code == 400
    assert api_a.patch("/api/v1/settings", {"other": 1}, format="json").status_code == 400
    assert client_for(None).get("/api/v1/settings").status_code == 401


def preflight(origin: str):  # noqa: ANN201
    return client_for(None).options("/inbox/v1/feed", HTTP_ORIGIN=origin, HTTP_ACCESS_CONTROL_REQUEST_METHOD="GET",
                                    HTTP_ACCESS_CONTROL_REQUEST_HEADERS="authorization")  # fmt: skip


def test_preflight_only_for_an_origin_some_tenant_allows(api_a):
    allow(api_a, APP)
    granted = preflight(APP)
    assert granted.status_code == 204
    assert granted["Access-Control-Allow-Origin"] == APP
    assert "Authorization" in granted["Access-Control-Allow-Headers"]
    assert "POST" in granted["Access-Control-Allow-Methods"]
    refused = preflight("https://evil.example.com")
    assert "Access-Control-Allow-Origin" not in refused
    assert "Origin" in refused["Vary"]


def test_a_request_is_granted_only_for_its_tenants_origins(api_a, api_b):
    allow(api_a, APP)
    allow(api_b, "https://b.example.com")
    subscriber(api_a)
    token = api_a.post("/api/v1/subscribers/jane/inbox-token", {}, format="json").json()["token"]
    client = client_for(None)
    ok = client.get("/inbox/v1/counts", HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_ORIGIN=APP)
    assert ok.status_code == 200 and ok["Access-Control-Allow-Origin"] == APP
    assert "Access-Control-Allow-Credentials" not in ok
    for origin in ("https://b.example.com", "https://evil.example.com", "http://app.example.com"):
        other = client.get("/inbox/v1/counts", HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_ORIGIN=origin)
        assert other.status_code == 200 and "Access-Control-Allow-Origin" not in other, origin
    unauthenticated = client.get("/inbox/v1/counts", HTTP_ORIGIN=APP)
    assert unauthenticated.status_code == 401 and "Access-Control-Allow-Origin" not in unauthenticated
    tenant_api = api_a.get("/api/v1/settings", HTTP_ORIGIN=APP)
    assert "Access-Control-Allow-Origin" not in tenant_api
    assert (
        client_for(None)
        .options("/api/v1/notifications", HTTP_ORIGIN=APP, HTTP_ACCESS_CONTROL_REQUEST_METHOD="GET")
        .get("Access-Control-Allow-Origin")
        is None
    )
