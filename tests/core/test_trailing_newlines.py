"""Patterns anchored with `$` match before a trailing newline: every value the API checks against a
pattern is matched whole, so `"+15550100123\n"` is a 400 naming its field, never a stored value."""

from __future__ import annotations

import pytest

from core.api.schema import FullRegexField
from core.validation import NAME, check_name, check_recipient
from notifications.models import Notification
from providers.models import Provider
from recipients.models import Subscriber
from tests.support.setups import email

pytestmark = pytest.mark.django_db

PHONE_NL = "+15550100123\n"


def details(response) -> dict:  # noqa: ANN001
    assert response.status_code == 400, response.content
    return response.json()["error"]["details"]


@pytest.mark.parametrize(
    ("value", "channel"),
    [(PHONE_NL, "sms"), ("+15550100123\r\n", "sms"), ("jane@example.com\n", "email")],
)
def test_check_recipient_refuses_a_trailing_newline(value, channel):
    with pytest.raises(ValueError, match="must be"):
        check_recipient(value, channel)


def test_check_name_and_regex_fields_match_the_whole_value():
    with pytest.raises(ValueError, match="must be a name"):
        check_name("hook\n")
    field = FullRegexField(NAME.pattern)
    assert field.run_validation("hook") == "hook"
    with pytest.raises(Exception, match="does not match|invalid|pattern"):
        field.run_validation("hook\n")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"channel": "sms", "recipient": PHONE_NL, "body": "b"}, "recipient"),
        (email(queue="default\n"), "queue"),
        (email(provider="mail\n"), "provider"),
        (email(category="general\n"), "category"),
        ({"channel": "email", "recipient": "jane@example.com", "template": "welcome\n", "context": {}}, "template"),
    ],
)
def test_notifications_refuse_trailing_newlines_naming_the_field(api_a, setup_a, body, field):
    assert field in details(api_a.post("/api/v1/notifications", body, format="json"))
    batch = api_a.post("/api/v1/notifications/batch", {"notifications": [email(), body]}, format="json")
    assert field in details(batch)["notifications"]["1"]
    assert not Notification.objects.exists()


def test_subscriber_phone_with_a_trailing_newline_is_400(api_a, tenant_a):
    response = api_a.put("/api/v1/subscribers/u1", {"phone": PHONE_NL}, format="json")
    assert "phone" in details(response)
    assert not Subscriber.objects.exists()


def test_provider_name_with_a_trailing_newline_is_400(api_a, tenant_a):
    body = {"name": "hook\n", "channel": "email", "kind": "console", "config": {}}
    assert "name" in details(api_a.post("/api/v1/providers", body, format="json"))
    assert not Provider.objects.exists()


def test_template_key_with_a_trailing_newline_is_400(api_a, tenant_a):
    body = {"key": "welcome\n", "channel": "email", "subject": "s", "body": "b"}
    assert "key" in details(api_a.post("/api/v1/templates", body, format="json"))


def test_quiet_hours_with_a_trailing_newline_is_400(api_a, tenant_a):
    body = {"quiet_hours": {"start": "22:00\n", "end": "07:00"}}
    assert "quiet_hours" in details(api_a.patch("/api/v1/categories/general", body, format="json"))


def test_idempotency_key_with_a_trailing_newline_is_400(api_a, setup_a):
    response = api_a.post("/api/v1/notifications", email(), format="json", HTTP_IDEMPOTENCY_KEY="key-1\n")
    assert "Idempotency-Key" in details(response)
    assert not Notification.objects.exists()
