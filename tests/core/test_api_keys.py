from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core.models import ApiKey
from core.models.api_keys import KEY_RE
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def test_issued_key_has_contract_format_and_only_hash_is_stored(tenant_a):
    key, raw = ApiKey.issue(tenant_a)
    match = KEY_RE.match(raw)
    assert match and len(match["prefix"]) == 8 and len(match["secret"]) >= 32
    with connection.cursor() as cursor:
        cursor.execute("SELECT prefix, key_hash FROM api_keys WHERE id = %s", [key.pk])
        prefix, key_hash = cursor.fetchone()
    assert prefix == match["prefix"]
    assert match["secret"] not in key_hash and raw != key_hash


def test_valid_key_authenticates_and_sets_tenant(api_a, tenant_a):
    response = api_a.get("/api/v1/tenant")
    assert response.status_code == 200
    assert response.json() == {"id": str(tenant_a.pk), "name": "tenant-a"}


@pytest.mark.parametrize("header", [None, "Bearer nope", "Bearer op_AAAAAAAA_" + "x" * 40, "Basic abc"])
def test_missing_or_invalid_key_is_401_with_error_shape(header):
    from rest_framework.test import APIClient

    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/tenant")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_revoked_key_is_401(tenant_a):
    key, raw = ApiKey.issue(tenant_a)
    assert client_for(raw).get("/api/v1/tenant").status_code == 200
    assert key.revoke() is True
    assert key.revoke() is False
    assert client_for(raw).get("/api/v1/tenant").status_code == 401


def test_key_with_right_prefix_but_wrong_secret_is_401(tenant_a):
    key, raw = ApiKey.issue(tenant_a)
    forged = f"op_{key.prefix}_" + "A" * 40
    assert client_for(forged).get("/api/v1/tenant").status_code == 401


def test_inactive_tenant_key_is_401(tenant_a, key_a):
    tenant_a.is_active = False
    tenant_a.save()
    assert client_for(key_a).get("/api/v1/tenant").status_code == 401


def test_last_used_is_written_at_most_once_a_minute(tenant_a, django_assert_num_queries, time_machine):
    time_machine.move_to(timezone.now(), tick=False)
    key, raw = ApiKey.issue(tenant_a)
    client = client_for(raw)
    client.get("/api/v1/tenant")
    key.refresh_from_db()
    first = key.last_used_at
    assert first is not None
    with django_assert_num_queries(0):  # the key is cached (core.auth_cache) and written at most once a minute
        client.get("/api/v1/tenant")
    key.refresh_from_db()
    assert key.last_used_at == first
    time_machine.shift(timedelta(minutes=2))
    with django_assert_num_queries(1):  # still cached; the minute has passed, so one conditional write
        client.get("/api/v1/tenant")
    key.refresh_from_db()
    assert key.last_used_at > first
