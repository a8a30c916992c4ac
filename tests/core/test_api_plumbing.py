"""API plumbing: the error shape, body size limit, hostile JSON, per-tenant throttling, ops endpoints."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from unittest import mock

import pytest
from django.db import OperationalError
from django.test import Client, override_settings
from rest_framework.exceptions import ParseError

from core.api.errors import exception_handler
from core.api.parsers import MAX_DEPTH, StrictJSONParser
from core.api.throttling import TenantRateThrottle
from tests.conftest import client_for
from tests.core.conftest import REPO

pytestmark = pytest.mark.django_db


def assert_error_shape(response, status: int, code: str) -> dict:  # noqa: ANN001
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)
    return body["error"]


@pytest.fixture(autouse=True)
def fresh_throttle_buckets():  # noqa: ANN201
    TenantRateThrottle._local.clear()
    yield
    TenantRateThrottle._local.clear()


# --- error shape -------------------------------------------------------------------------------


def test_401_shape(anonymous):
    assert_error_shape(anonymous.get("/api/v1/tenant"), 401, "unauthenticated")


def test_404_shape_for_unknown_api_paths(api_a, anonymous):
    assert_error_shape(api_a.get("/api/v1/no-such-thing"), 404, "not_found")
    assert_error_shape(anonymous.get("/api/v2/tenant"), 404, "not_found")


def test_405_shape(api_a):
    error = assert_error_shape(api_a.post("/api/v1/tenant", {}, format="json"), 405, "method_not_allowed")
    assert "POST" in error["message"]
    assert_error_shape(api_a.delete("/api/v1/tenant"), 405, "method_not_allowed")


def test_405_is_still_401_without_a_key(anonymous):
    assert_error_shape(anonymous.post("/api/v1/tenant", {}, format="json"), 401, "unauthenticated")


@override_settings(OMNIPOST_MAX_REQUEST_BYTES=64)
def test_bodies_over_the_limit_are_413(api_a):
    body = json.dumps({"body": "x" * 100})
    error = assert_error_shape(
        api_a.post("/api/v1/tenant", body, content_type="application/json"), 413, "request_too_large"
    )
    assert error["details"] == {"limit_bytes": 64}
    # at the limit the request goes through to the view (405: the route has no POST)
    at_limit = json.dumps({"b": "x" * (64 - 9)})
    assert len(at_limit) == 64
    assert api_a.post("/api/v1/tenant", at_limit, content_type="application/json").status_code == 405


def test_non_numeric_content_length_is_400(api_a):
    response = api_a.generic("POST", "/api/v1/tenant", b"{}", "application/json", CONTENT_LENGTH="lots")
    assert_error_shape(response, 400, "bad_request")


def test_parse_error_shape_through_the_exception_handler():
    response = exception_handler(ParseError("JSON parse error: nope"), {})
    assert response.status_code == 400
    assert response.data == {"error": {"code": "parse_error", "message": "JSON parse error: nope", "details": {}}}


# --- hostile JSON --------------------------------------------------------------------------------


def parse(raw: bytes):  # noqa: ANN201
    return StrictJSONParser().parse(io.BytesIO(raw), "application/json", {})


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"recipient": "\xff\xfe"}', "UTF-8"),
        (b'{"recipient": "a\x00b"}', "NUL"),
        (b'{"recipient": "a\\u0000b"}', "NUL"),
        (b'{"a\\u0000": 1}', "NUL"),
        (b"[" * 1000 + b"]" * 1000, "nested"),
        (b'{"a": ' * 100 + b"1" + b"}" * 100, "nested"),
        (b"[" * 100_000, "nested"),
        (b'{"n": ' + b"1" * 5000 + b"}", "integer"),
        (b'{"n": NaN}', "NaN"),
        (b'{"n": Infinity}', "Infinity"),
        (b'{"n": -Infinity}', "Infinity"),
        (b'{"n": 1e999}', "finite"),
        (b'{"a": 1', "JSON parse error"),
        (b"\xef\xbb\xbf{}", "JSON parse error"),
    ],
)
def test_hostile_json_is_a_parse_error(raw, why):
    with pytest.raises(ParseError, match=why):
        parse(raw)


def test_reasonable_json_parses():
    nested = b'{"a": ' * (MAX_DEPTH - 1) + b"1" + b"}" * (MAX_DEPTH - 1)
    assert parse(nested)
    assert parse(b'{"n": 12345678901234567890, "f": 1.5, "s": "caf\xc3\xa9"}') == {
        "n": 12345678901234567890,
        "f": 1.5,
        "s": "café",
    }
    assert parse(b"") == {}


def _typed(value):  # noqa: ANN001, ANN202 - a parsed value with every leaf's type beside it
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1, "a": 2}',
        b"[1.0, -0.0, 1e16, 2.5e-3, 0.1, 123456789.123456789]",
        b'{"n": 9223372036854775807, "m": -9223372036854775808, "u": 18446744073709551615}',
        b'{"n": 18446744073709551616, "big": 123456789012345678901234567890}',
        b'{"s": "\\ud83d\\ude00 \\u2028 caf\xc3\xa9"}',
        b'{"s": "\\ud800"}',
        b"  [true, false, null, {}, []]  ",
        b'{"phone": "+14155550123", "order": "1234567890123456789012"}',
    ],
)
def test_bodies_parse_as_the_standard_library_parses_them(raw):
    """orjson reads them where it reads alike, the standard library the rest: same values, same types."""
    assert _typed(parse(raw)) == _typed(json.loads(raw))


# --- throttling ----------------------------------------------------------------------------------


@override_settings(OMNIPOST_RATE_LIMIT_API=3)
def test_the_n_plus_first_request_is_429_and_other_tenants_are_unaffected(api_a, api_b):
    for _ in range(3):
        assert api_a.get("/api/v1/tenant").status_code == 200
    response = api_a.get("/api/v1/tenant")
    error = assert_error_shape(response, 429, "rate_limited")
    assert int(response["Retry-After"]) >= 1
    assert int(response["Retry-After"]) <= 60
    assert error["details"].get("retry_after_seconds") == int(response["Retry-After"])
    assert api_b.get("/api/v1/tenant").status_code == 200  # tenant B has its own bucket


@override_settings(OMNIPOST_RATE_LIMIT_API=60)
def test_the_bucket_refills_over_time(api_a, tenant_a):
    from django.db import connection

    from queueing.models import RateBucket

    def db_clock(offset_seconds: float):  # noqa: ANN202
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp() + make_interval(secs => %s)", [offset_seconds])
            return cursor.fetchone()[0]

    # A full bucket (60 at 60/min) whose clock stands an hour ahead: it cannot refill while the 60
    # requests run, however slow the machine (a bucket's clock never moves backwards).
    key = f"api:{tenant_a.pk}"
    RateBucket.objects.create(key=key, rate=1.0, effective_rate=1.0, burst=60.0, tokens=60.0, updated_at=db_clock(3600))
    for _ in range(60):
        assert api_a.get("/api/v1/tenant").status_code == 200
    response = api_a.get("/api/v1/tenant")
    assert response.status_code == 429 and response["Retry-After"] == "1"
    # One token a second, on the database clock: put the bucket's clock 1.05 s in the past.
    RateBucket.objects.filter(key=key).update(updated_at=db_clock(-1.05))
    assert api_a.get("/api/v1/tenant").status_code == 200
    assert api_a.get("/api/v1/tenant").status_code == 429


@override_settings(OMNIPOST_RATE_LIMIT_API=6)
def test_the_limit_holds_across_processes_sharing_the_bucket(api_a, tenant_a):
    """Two web processes are two in-memory allotments over one database bucket."""
    for _ in range(3):
        assert api_a.get("/api/v1/tenant").status_code == 200
    TenantRateThrottle._local.clear()  # "another process": nothing held in memory
    statuses = [api_a.get("/api/v1/tenant").status_code for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]


def test_keys_of_one_tenant_share_its_bucket(tenant_a):
    from core.models import ApiKey

    clients = [client_for(ApiKey.issue(tenant_a)[1]) for _ in range(2)]
    with override_settings(OMNIPOST_RATE_LIMIT_API=2):
        assert clients[0].get("/api/v1/tenant").status_code == 200
        assert clients[1].get("/api/v1/tenant").status_code == 200
        assert clients[0].get("/api/v1/tenant").status_code == 429
        assert clients[1].get("/api/v1/tenant").status_code == 429


@override_settings(OMNIPOST_RATE_LIMIT_API=0)
def test_a_zero_limit_means_unlimited_not_a_crash(api_a):
    for _ in range(3):
        assert api_a.get("/api/v1/tenant").status_code == 200


# --- ops endpoints ------------------------------------------------------------------------------


def test_healthz():
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_ready_with_migrations_applied():
    response = Client().get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ready"
    assert body["checks"] == {"database": "ok", "migrations": "ok", "scheduler": "ok"}
    assert body["workers"] == {"live": 0, "stale": 0, "stale_by_kind": {"dispatcher": 0, "scheduler": 0}}
    assert body["warnings"] == []


def test_readyz_503_when_the_database_is_unreachable():
    with mock.patch("django.db.backends.base.base.BaseDatabaseWrapper.cursor", side_effect=OperationalError("down")):
        response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"].startswith("unreachable")


def test_readyz_503_with_unapplied_migrations():
    with mock.patch("django.db.migrations.executor.MigrationExecutor.migration_plan", return_value=[("m", False)]):
        response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"] == "1 unapplied"


def test_readyz_503_in_a_process_pointed_at_a_dead_database():
    script = (
        "import django; django.setup();"
        "from django.test import Client;"
        "r = Client().get('/readyz'); h = Client().get('/healthz');"
        "print(r.status_code, h.status_code, r.json()['checks']['database'])"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "omnipost_site.settings_test",
        "DATABASE_URL": "postgres://postgres:postgres@127.0.0.1:1/nowhere",
    }
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:3] == ["503", "200", "unreachable:"]


def test_openapi_schema():
    response = Client().get("/api/schema/?format=json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert "/api/v1/tenant" in schema["paths"]
    assert schema["components"]["securitySchemes"]["ApiKey"]["scheme"] == "bearer"
    yaml = Client().get("/api/schema/")
    assert yaml.status_code == 200 and b"openapi: 3" in yaml.content


def test_swagger_ui():
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "swagger-ui" in html.lower() and "/api/schema/" in html
