"""Idempotency-Key on POST notifications and POST notifications/batch."""

from __future__ import annotations

import threading
from datetime import timedelta

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from notifications import services
from notifications.api.idempotency import IN_FLIGHT_TIMEOUT
from notifications.models import IdempotencyRecord, Notification
from tests.support.setups import email, make_setup

URL = "/api/v1/notifications"
BATCH = "/api/v1/notifications/batch"
# Every keyed single create here that is a 201, a replay or a 409 is the hot path's (its test of the
# views' answers: tests/notifications/test_api_hot_path.py).
pytestmark = pytest.mark.usefixtures("keyed_creates_on_the_hot_path")


def post(client, body, key: str | None = "key-1", url: str = URL):  # noqa: ANN001, ANN201
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(url, body, format="json", **headers)


@pytest.mark.django_db
class TestReplay:
    def test_same_key_and_body_replays_the_first_response(self, api_a, setup_a):
        first = post(api_a, email())
        second = post(api_a, email())
        assert first.status_code == second.status_code == 201
        assert second.content == first.content
        assert second["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
        assert Notification.objects.count() == 1
        record = IdempotencyRecord.objects.get()
        assert record.state == "completed" and record.response_status == 201
        with connection.cursor() as cursor:
            cursor.execute("SELECT response_body FROM idempotency_records")
            assert cursor.fetchone()[0].startswith("gAAAAA")  # a Fernet token, not the JSON

    def test_batch_replays_too(self, api_a, setup_a):
        body = {"notifications": [email(subject=str(i)) for i in range(5)]}
        first = post(api_a, body, url=BATCH)
        second = post(api_a, body, url=BATCH)
        assert first.status_code == second.status_code == 201 and first.content == second.content
        assert Notification.objects.count() == 5

    def test_key_order_in_the_body_does_not_matter(self, api_a, setup_a):
        post(api_a, {"channel": "email", "recipient": "a@example.com", "body": "b"})
        again = post(api_a, {"body": "b", "recipient": "a@example.com", "channel": "email"})
        assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"

    def test_other_body_or_path_is_422(self, api_a, setup_a):
        post(api_a, email())
        for response in (post(api_a, email(subject="other")), post(api_a, {"notifications": [email()]}, url=BATCH)):
            assert response.status_code == 422
            assert response.json()["error"]["code"] == "idempotency_key_reused"
        assert Notification.objects.count() == 1

    def test_without_a_key_every_request_creates(self, api_a, setup_a):
        post(api_a, email(), key=None)
        post(api_a, email(), key=None)
        assert Notification.objects.count() == 2 and not IdempotencyRecord.objects.exists()

    def test_keys_belong_to_a_tenant(self, api_a, api_b, setup_a, setup_b):
        a = post(api_a, email())
        b = post(api_b, email())
        assert a.status_code == b.status_code == 201 and a.json()["id"] != b.json()["id"]
        assert "Idempotent-Replayed" not in b

    def test_validation_errors_are_not_stored(self, api_a, setup_a):
        # Stripe's rule (issue 19): a 400 keeps no key, so the same bad request is judged again.
        first = post(api_a, email(recipient="nope"))
        second = post(api_a, email(recipient="nope"))
        assert first.status_code == second.status_code == 400 and first.content == second.content
        assert "Idempotent-Replayed" not in second
        assert not Notification.objects.exists() and not IdempotencyRecord.objects.exists()

    def test_a_server_error_releases_the_key(self, api_a, setup_a, monkeypatch):
        def boom(*args: object, **kwargs: object) -> None:
            raise RuntimeError("database fell over")

        monkeypatch.setattr(services, "create_notifications", boom)
        with pytest.raises(RuntimeError):
            post(api_a, email())
        assert not IdempotencyRecord.objects.exists() and not Notification.objects.exists()
        monkeypatch.undo()
        retry = post(api_a, email())
        assert retry.status_code == 201 and "Idempotent-Replayed" not in retry

    def test_in_flight_is_409(self, api_a, setup_a):
        post(api_a, email())
        IdempotencyRecord.objects.update(state="in_flight")
        response = post(api_a, email())
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "idempotency_request_in_progress"
        assert post(api_a, email(subject="x")).status_code == 422  # another body is still a misuse

    def test_an_abandoned_in_flight_record_is_taken_over(self, api_a, setup_a):
        IdempotencyRecord.objects.create(
            tenant=setup_a.tenant, key="key-1", fingerprint="0" * 64, state="in_flight",
            expires_at=timezone.now() + timedelta(hours=1),
        )  # fmt: skip
        IdempotencyRecord.objects.update(created_at=timezone.now() - IN_FLIGHT_TIMEOUT - timedelta(seconds=1))
        response = post(api_a, email())
        assert response.status_code == 201 and Notification.objects.count() == 1

    def test_expired_keys_are_treated_as_new(self, api_a, setup_a):
        first = post(api_a, email())
        IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
        second = post(api_a, email(subject="a new request"))
        assert second.status_code == 201 and "Idempotent-Replayed" not in second
        assert second.json()["id"] != first.json()["id"]
        record = IdempotencyRecord.objects.get()
        assert record.expires_at > timezone.now() + timedelta(hours=23)

    def test_keys_live_24_hours(self, api_a, setup_a, time_machine):
        time_machine.move_to(timezone.now(), tick=False)
        post(api_a, email())
        time_machine.shift(timedelta(hours=23, minutes=59))
        assert post(api_a, email())["Idempotent-Replayed"] == "true"
        time_machine.shift(timedelta(minutes=2))
        assert "Idempotent-Replayed" not in post(api_a, email())
        assert Notification.objects.count() == 2

    @pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there"])
    def test_malformed_keys_are_400(self, api_a, setup_a, key):
        response = post(api_a, email(), key=key)
        assert response.status_code == 400, response.content
        assert "Idempotency-Key" in response.json()["error"]["details"]
        assert not IdempotencyRecord.objects.exists()

    def test_a_255_character_key_is_fine(self, api_a, setup_a):
        assert post(api_a, email(), key="k" * 255).status_code == 201


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_20_concurrent_requests_with_one_key_create_one_notification(live_server, tenant_a, key_a):
    make_setup(tenant_a)
    barrier = threading.Barrier(20)
    results: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def send() -> None:
        with httpx.Client(base_url=live_server.url, timeout=30) as client:
            barrier.wait()
            response = client.post(
                URL, json=email(), headers={"Authorization": f"Bearer {key_a}", "Idempotency-Key": "same-key"}
            )
        with lock:
            results.append((response.status_code, response.json()))

    threads = [threading.Thread(target=send) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 20
    statuses = sorted(status for status, _ in results)
    assert set(statuses) <= {201, 409}, statuses
    assert 201 in statuses
    ids = {body["id"] for status, body in results if status == 201}
    assert len(ids) == 1
    for status, body in results:
        if status == 409:
            assert body["error"]["code"] == "idempotency_request_in_progress"
    assert Notification.objects.count() == 1 and str(Notification.objects.get().pk) == ids.pop()
    assert IdempotencyRecord.objects.get().state == "completed"
