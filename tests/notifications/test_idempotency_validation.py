"""Idempotency per Stripe (issue 19, item 6): only a request that started executing keeps its key.

A request that fails authentication, parsing or validation stores no `Idempotency-Key` record, so
the corrected retry with the same key is created (`201`), not refused as a reused key (`422`).
"""

from __future__ import annotations

import pytest

from notifications.models import IdempotencyRecord, Notification
from tests.support.setups import email

URL = "/api/v1/notifications"
BATCH = "/api/v1/notifications/batch"
KEY = "retry-after-fix"
# Every keyed single create here that is a 201, a replay or a 409 is the hot path's (its test of the
# views' answers: tests/notifications/test_api_hot_path.py).
pytestmark = pytest.mark.usefixtures("keyed_creates_on_the_hot_path")


def post(client, body, url: str = URL, key: str = KEY, **extra):  # noqa: ANN001, ANN201
    return client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)


@pytest.mark.django_db
class TestNothingStoredBeforeExecution:
    def test_single_400_then_corrected_retry_is_201(self, api_a, setup_a):
        bad = post(api_a, email(recipient="not-an-address"))
        assert bad.status_code == 400 and "recipient" in bad.json()["error"]["details"]
        assert not IdempotencyRecord.objects.exists()

        fixed = post(api_a, email())
        assert fixed.status_code == 201, fixed.content
        assert "Idempotent-Replayed" not in fixed
        replay = post(api_a, email())  # from now on the key is bound to the request that ran
        assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
        assert replay.json()["id"] == fixed.json()["id"] and Notification.objects.count() == 1
        assert post(api_a, email(recipient="not-an-address")).status_code == 422

    def test_batch_400_then_corrected_retry_is_201(self, api_a, setup_a):
        items = [email(subject=str(i)) for i in range(3)]
        bad = post(api_a, {"notifications": [*items, email(template="no-such-template", subject=None)]}, url=BATCH)
        assert bad.status_code == 400, bad.content
        assert "3" in bad.json()["error"]["details"]["notifications"]
        assert not IdempotencyRecord.objects.exists() and not Notification.objects.exists()

        fixed = post(api_a, {"notifications": [*items, email(subject="3")]}, url=BATCH)
        assert fixed.status_code == 201, fixed.content
        assert len(fixed.json()["results"]) == 4 and Notification.objects.count() == 4
        assert IdempotencyRecord.objects.get().state == "completed"

    def test_a_render_failure_found_while_resolving_stores_nothing(self, api_a, setup_a):
        setup_a.welcome.body = "{{ n|divisibleby:0 }}"
        setup_a.welcome.save()
        bad = post(api_a, {"channel": "email", "recipient": "a@example.com", "template": "welcome"})
        assert bad.status_code == 400 and not IdempotencyRecord.objects.exists()
        setup_a.welcome.body = "fixed"
        setup_a.welcome.save()
        fixed = post(api_a, {"channel": "email", "recipient": "a@example.com", "template": "welcome"})
        assert fixed.status_code == 201 and fixed.json()["body"] == "fixed"

    def test_unparsable_body_stores_nothing(self, api_a, setup_a):
        bad = api_a.post(URL, data="{not json", content_type="application/json", HTTP_IDEMPOTENCY_KEY=KEY)
        assert bad.status_code == 400, bad.content
        assert not IdempotencyRecord.objects.exists()
        assert post(api_a, email()).status_code == 201

    def test_failed_authentication_stores_nothing(self, anonymous, api_a, setup_a):
        assert post(anonymous, email()).status_code == 401
        bad_key = post(anonymous, email(), HTTP_AUTHORIZATION="Bearer op_live_not-a-real-key")
        assert bad_key.status_code == 401
        assert not IdempotencyRecord.objects.exists()
        assert post(api_a, email()).status_code == 201

    def test_a_400_does_not_release_a_key_that_another_request_completed(self, api_a, setup_a):
        assert post(api_a, email()).status_code == 201
        assert post(api_a, email(recipient="nope")).status_code == 422  # a misuse of a used key, still
        assert IdempotencyRecord.objects.get().state == "completed"
