"""The subscriber's own preferences on /inbox/v1/: read, merged by PATCH, critical categories never
turned off, and they decide like any preferences (an opted-out in_app notification is suppressed)."""

from __future__ import annotations

import pytest

from tests.conftest import client_for
from tests.inbox.support import subscriber

pytestmark = pytest.mark.django_db


def reader(api, external_id: str = "jane"):  # noqa: ANN001, ANN201
    token = api.post(f"/api/v1/subscribers/{external_id}/inbox-token", {}, format="json").json()["token"]
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_preferences_are_read_and_merged(api_a):
    assert api_a.post("/api/v1/categories", {"key": "news"}, format="json").status_code == 201
    subscriber(api_a, preferences={"general": {"email": False}})
    jane = reader(api_a)
    assert jane.get("/inbox/v1/preferences").json() == {"general": {"email": False}}
    merged = jane.patch("/inbox/v1/preferences", {"news": {"in_app": False}, "general": {"sms": False}},
                        format="json")  # fmt: skip
    assert merged.status_code == 200, merged.content
    assert merged.json() == {"general": {"email": False, "sms": False}, "news": {"in_app": False}}
    assert api_a.get("/api/v1/subscribers/jane").json()["preferences"] == merged.json()
    for bad in ({"nope": {"email": False}}, {"news": {"fax": False}}, {"news": {"email": "no"}}, ["news"]):
        assert jane.patch("/inbox/v1/preferences", bad, format="json").status_code == 400, bad


def test_a_critical_category_cannot_be_turned_off(api_a):
    assert api_a.post("/api/v1/categories", {"key": "security", "critical": True}, format="json").status_code == 201
    subscriber(api_a)
    jane = reader(api_a)
    refused = jane.patch("/inbox/v1/preferences", {"security": {"in_app": False}}, format="json")
    assert refused.status_code == 400
    assert jane.get("/inbox/v1/preferences").json() == {}
    assert jane.patch("/inbox/v1/preferences", {"security": {"in_app": True}}, format="json").status_code == 200


def test_an_opted_out_in_app_notification_is_suppressed(api_a):
    subscriber(api_a)
    reader(api_a).patch("/inbox/v1/preferences", {"general": {"in_app": False}}, format="json")
    made = api_a.post("/api/v1/notifications", {"channel": "in_app", "subscriber": "jane", "body": "b"},
                      format="json")  # fmt: skip
    assert made.status_code == 201 and made.json()["status"] == "suppressed"


def test_each_subscriber_sees_only_their_own(api_a):
    subscriber(api_a, preferences={"general": {"email": False}})
    subscriber(api_a, "joe")
    assert reader(api_a, "joe").get("/inbox/v1/preferences").json() == {}
