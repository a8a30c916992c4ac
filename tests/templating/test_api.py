"""`templates/{key}`: a tenant's templates through the API, checked, audited and kept while used."""

from __future__ import annotations

import pytest

from core.models import AuditEvent
from notifications.models import Notification
from templating.models import Template
from tests.support.setups import EMAIL

pytestmark = pytest.mark.django_db

TEMPLATES = "/api/v1/templates"


def test_template_lifecycle(api_a, tenant_a):
    body = {"key": "reset", "channel": "email", "subject": "Reset", "body": "Code {{ code }}"}
    assert api_a.post(TEMPLATES, body, format="json").status_code == 201
    assert api_a.post(TEMPLATES, body, format="json").status_code == 409
    assert api_a.get(f"{TEMPLATES}/reset").json()["body"] == "Code {{ code }}"
    response = api_a.patch(f"{TEMPLATES}/reset", {"body": "New {{ code }}"}, format="json")
    assert response.status_code == 200 and response.json()["body"] == "New {{ code }}"
    assert api_a.patch(f"{TEMPLATES}/reset", {"key": "other"}, format="json").status_code == 400
    assert api_a.patch(f"{TEMPLATES}/reset", {"body": "{% load x %}"}, format="json").status_code == 400
    assert Template.objects.get(key="reset").body == "New {{ code }}"
    assert api_a.delete(f"{TEMPLATES}/reset").status_code == 204
    assert not Template.objects.exists()
    actions = list(AuditEvent.objects.filter(target_type="templating.template").values_list("action", flat=True))
    assert sorted(actions) == ["template.created", "template.deleted", "template.updated"]


def test_notifications_keep_what_was_rendered_when_their_template_goes(api_a, setup_a):
    """Only sequence steps keep a template (409 template_in_use, tests/notifications/test_api_sequences.py)."""
    sent = {"channel": "email", "recipient": EMAIL, "template": "welcome", "context": {"name": "Jo"}}
    created = api_a.post("/api/v1/notifications", sent, format="json").json()
    assert api_a.delete(f"{TEMPLATES}/welcome").status_code == 204
    kept = Notification.objects.get(pk=created["id"])
    assert (kept.template_id, kept.subject, kept.body) == (None, "Hi Jo", "Welcome, Jo!")


def test_a_duplicate_key_is_409_already_exists_whatever_the_key_says(api_a, tenant_a):
    body = {"key": "default-welcome", "channel": "email", "body": "Hi"}
    assert api_a.post(TEMPLATES, body, format="json").status_code == 201
    response = api_a.post(TEMPLATES, body, format="json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "already_exists"
