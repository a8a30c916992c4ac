"""Recipients, keys and secrets never leave in clear: masking helpers, logs, audit details, admin pages."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest
from django.db import connection

from core.logging import JsonFormatter, MaskingFilter
from core.masking import mask_mapping, mask_recipient, mask_text
from core.models import AuditEvent
from tests.core.conftest import EMAIL, PHONE, REPO, WHSEC

API_KEY = "op_AbCd1234_" + "x9" * 20


@pytest.mark.parametrize(
    ("channel", "value", "masked"),
    [
        ("email", "jane@example.com", "j***@example.com"),
        ("sms", "+15551234567", "+1******4567"),
        ("push", "tok_abcdefgh9f2c", "tok_****9f2c"),
        ("webhook", "https://hooks.example.test/x/abcd", "****abcd"),
    ],
)
def test_recipient_masks_follow_the_contract(channel, value, masked):
    assert mask_recipient(channel, value) == masked


def test_free_text_masking():
    text = mask_text(f"to {EMAIL} or {PHONE} with Bearer {API_KEY} signed {WHSEC}")
    for secret in (EMAIL, PHONE, API_KEY, WHSEC, "x9x9x9x9", "5551234"):
        assert secret not in text
    assert "j***@example.com" in text and "+1******4567" in text
    assert "op_AbCd1234_****" in text and "whsec_****" in text
    assert mask_text(text) == text  # idempotent


def test_mapping_masking_hides_secret_named_keys_and_scrubs_text():
    masked = mask_mapping(
        {"password": "hunter2hunter2", "nested": [{"auth_token": "abc"}], "note": f"mail {EMAIL}", "n": 3}
    )
    assert masked == {
        "password": "****ter2",
        "nested": [{"auth_token": "****"}],
        "note": "mail j***@example.com",
        "n": 3,
    }


# --- logging ------------------------------------------------------------------------------------


def _emit(formatter: logging.Formatter, *, exc: bool = False) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(MaskingFilter())
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"omnipost.test.masking.{id(formatter)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        if exc:
            try:
                raise ValueError(f"provider rejected {EMAIL}")
            except ValueError:
                logger.exception("delivery to %s crashed", PHONE)
        else:
            logger.info(
                "sending to %s and %s using %s signed with %s",
                EMAIL,
                PHONE,
                API_KEY,
                WHSEC,
                extra={"notification_id": "n-1", "tenant_id": "t-1"},
            )
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def _assert_clean(output: str) -> None:
    for secret in (EMAIL, PHONE, API_KEY, WHSEC, "jane.doe", "5551234567"):
        assert secret not in output, secret


def test_log_lines_are_masked_in_text_format():
    output = _emit(logging.Formatter("%(levelname)s %(message)s"))
    _assert_clean(output)
    assert "j***@example.com" in output and "op_AbCd1234_****" in output and "whsec_****" in output


def test_log_lines_are_masked_in_json_format():
    record = json.loads(_emit(JsonFormatter()))
    _assert_clean(json.dumps(record))
    assert record["level"] == "INFO" and record["notification_id"] == "n-1" and record["tenant_id"] == "t-1"
    assert "+1******4567" in record["message"]


def test_json_formatter_masks_even_without_the_filter():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "to %s", (EMAIL,), None)
    _assert_clean(JsonFormatter().format(record))


@pytest.mark.parametrize("formatter", [logging.Formatter("%(message)s"), JsonFormatter()], ids=["text", "json"])
def test_tracebacks_are_masked(formatter):
    output = _emit(formatter, exc=True)
    _assert_clean(output)
    assert "ValueError: provider rejected j***@example.com" in output.replace("\\n", "\n")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_configured_logging_masks_djangos_own_loggers_too(log_format):
    """Request errors and runserver access lines go through the masking handler, never around it."""
    script = (
        "import django, logging; django.setup();"
        f"logging.getLogger('django.request').error('Bad request for {EMAIL}');"
        f"logging.getLogger('django.server').info('\"GET /?to={PHONE} HTTP/1.1\" 200');"
        f"logging.getLogger('notifications').warning('key {API_KEY}')"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "omnipost_site.settings_test",
        "OMNIPOST_LOG_FORMAT": log_format,
    }
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    _assert_clean(output)
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 3, output  # each record exactly once
    if log_format == "json":
        assert all(json.loads(line)["message"] for line in lines)


# --- audit details and admin pages ----------------------------------------------------------------


@pytest.mark.django_db
def test_audit_details_are_stored_masked(tenant_a):
    event = AuditEvent.record(
        actor="user:ops",
        action="provider.updated",
        target_type="provider",
        target_id="p1",
        tenant=tenant_a,
        details={"recipient": EMAIL, "phone": PHONE, "signing_secret": WHSEC, "why": f"by {API_KEY}"},
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT details::text FROM audit_events WHERE id = %s", [event.pk])
        (raw,) = cursor.fetchone()
    _assert_clean(raw)
    assert "j***@example.com" in raw


@pytest.mark.django_db
def test_audit_admin_page_shows_details_masked(rows_a, superuser_client):
    event = AuditEvent.record(
        actor="user:ops", action="notification.viewed", target=rows_a.notification, details={"to": EMAIL}
    )
    html = superuser_client.get(f"/admin/core/auditevent/{event.pk}/change/").content.decode()
    assert "notification.viewed" in html
    _assert_clean(html)
    assert "alice@example.com" not in html


@pytest.mark.django_db
def test_api_key_admin_shows_the_prefix_only(rows_a, superuser_client):
    for url in ("/admin/core/apikey/", f"/admin/core/apikey/{rows_a.api_key.pk}/change/"):
        html = superuser_client.get(url).content.decode()
        assert rows_a.api_key.prefix in html
        assert rows_a.raw_key not in html
        assert rows_a.raw_key.split("_")[2] not in html
        assert rows_a.api_key.key_hash not in html


@pytest.mark.django_db
def test_error_responses_do_not_echo_the_presented_key(rows_a):
    from tests.conftest import client_for

    bad = rows_a.raw_key[:-1] + ("A" if rows_a.raw_key[-1] != "A" else "B")
    response = client_for(bad).get("/api/v1/tenant")
    assert response.status_code == 401
    assert bad not in response.content.decode()


@pytest.mark.django_db
def test_no_admin_page_shows_a_recipient_secret_or_key_in_clear(rows_a, superuser_client):
    """Every registered changelist, and the change page of each of tenant A's rows whose model is registered
    (today: API keys, audit events, tenants; notifications, providers and DLQ entries once they have admins)."""
    from django.contrib import admin
    from django.urls import reverse

    objects = [rows_a.notification, rows_a.provider, rows_a.dead_letter, rows_a.api_key, rows_a.audit, rows_a.tenant]
    urls = []
    for model in admin.site._registry:
        info = (model._meta.app_label, model._meta.model_name)
        urls.append(reverse("admin:{}_{}_changelist".format(*info)))
        urls += [reverse("admin:{}_{}_change".format(*info), args=[o.pk]) for o in objects if type(o) is model]
    assert len(urls) >= 6
    for url in urls:
        response = superuser_client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        for secret in ("alice@example.com", WHSEC, rows_a.raw_key, rows_a.api_key.key_hash):
            assert secret not in html, (url, secret)
