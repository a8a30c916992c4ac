"""POST /hooks/providers/{id} with the webhook kind: Standard Webhooks signatures, 401 and nothing
stored for anything that does not verify, 404 where there is no inbound endpoint."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from notifications.models import Notification
from receipts import providers as provider_views
from receipts.models import NotificationEvent, ReceiptDedup
from receipts.views import MAX_BODY_BYTES
from tests import factories
from tests.receipts.conftest import SECRET_A, SECRET_B, signed

pytestmark = pytest.mark.django_db


def post(provider_id: int, body: bytes, headers: dict[str, str], client: Client | None = None):  # noqa: ANN201
    client = client or Client()
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(f"/hooks/providers/{provider_id}", body, content_type="application/json", **extra)


def event(note: Notification, type_: str = "delivered", **extra: object) -> dict:
    return {"type": type_, "notification_id": str(note.pk), "occurred_at": "2026-05-01T12:00:00Z", **extra}


def nothing_stored() -> bool:
    return not NotificationEvent.objects.exists() and not ReceiptDedup.objects.exists() and not (
        Notification.objects.exclude(receipt=None).exists()
    )


def test_a_signed_event_is_applied(side_a):
    note = side_a.notes[0]
    body, headers = signed(SECRET_A, event(note, "bounced", details={"bounce_type": "hard", "code": "5.1.1"}))
    response = post(side_a.provider.pk, body, headers)
    assert response.status_code == 200 and response.json() == {"received": 1}
    note.refresh_from_db()
    assert (note.receipt, note.bounce_type) == ("bounced", "hard")
    stored = NotificationEvent.objects.get(notification=note)
    assert stored.type == "bounced" and stored.occurred_at == datetime(2026, 5, 1, 12, tzinfo=UTC)
    assert stored.details == {"bounce_type": "hard", "code": "5.1.1"} and stored.provider_id == side_a.provider.pk
    # The same event again (same webhook-id): 200, one event.
    assert post(side_a.provider.pk, body, headers).json() == {"received": 1}
    assert NotificationEvent.objects.filter(notification=note).count() == 1


@pytest.mark.parametrize("case", ["bad_signature", "stale", "future", "other_secret", "other_url", "no_headers",
                                  "garbled_signature", "wrong_type", "not_json"])  # fmt: skip
def test_what_does_not_verify_is_401_and_stores_nothing(side_a, side_b, case):
    note = side_a.notes[0]
    target, secret, payload, stamp = side_a.provider.pk, SECRET_A, event(note, "bounced"), None
    if case == "stale":
        stamp = timezone.now() - timedelta(minutes=5, seconds=30)
    elif case == "future":
        stamp = timezone.now() + timedelta(minutes=6)
    elif case == "other_secret":
        secret = SECRET_B  # signed by tenant B's provider, posted to A's URL
    elif case == "other_url":
        target = side_b.provider.pk  # signed for A, posted to B's URL
    elif case == "wrong_type":
        payload = event(note, "opened")
    body, headers = signed(secret, payload, timestamp=stamp)
    if case == "not_json":
        body, headers = b"not json", signed_raw(secret, b"not json")
    if case == "bad_signature":
        headers["webhook-signature"] = "v1," + "A" * 44
    elif case == "no_headers":
        headers = {}
    elif case == "garbled_signature":
        headers["webhook-signature"] = "garbage"
    response = post(target, body, headers)
    assert response.status_code == 401, response.content
    assert response.json()["error"]["code"] == "invalid_signature"
    assert nothing_stored()


def signed_raw(secret: str, body: bytes) -> dict[str, str]:
    now = datetime.now(UTC)
    return {"webhook-id": "msg_raw", "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(secret).sign("msg_raw", now, body.decode())}  # fmt: skip


def test_another_tenants_notification_is_200_and_unchanged(side_a, side_b):
    theirs = side_b.notes[0]
    body, headers = signed(SECRET_A, event(theirs, "complained"))  # A's valid signature, B's notification
    response = post(side_a.provider.pk, body, headers)
    assert response.status_code == 200 and response.json() == {"received": 1}
    theirs.refresh_from_db()
    assert theirs.receipt is None and not NotificationEvent.objects.exists()
    metrics = Client().get("/metrics").content.decode()
    line = f'omnipost_receipts_ignored_total{{provider="hook",provider_id="{side_a.provider.pk}",reason="foreign"}} 1.0'
    assert line in metrics, [m for m in metrics.splitlines() if "receipts" in m]


def test_the_previous_secret_verifies_during_the_rotation_grace_only(side_a, settings):
    note = side_a.notes[0]
    new = "whsec_" + base64.b64encode(b"c" * 32).decode()
    provider = side_a.provider
    provider.previous_secrets = {"signing_secret": SECRET_A}
    provider.secrets = {"signing_secret": new}
    provider.secrets_rotated_at = timezone.now()
    provider.save()
    for secret in (new, SECRET_A):
        body, headers = signed(secret, event(note, "delivered"))
        assert post(provider.pk, body, headers).status_code == 200, secret
    settings.OMNIPOST_SECRET_ROTATION_GRACE_SECONDS = 0
    provider_views.clear()
    body, headers = signed(SECRET_A, event(note, "delivered"))
    assert post(provider.pk, body, headers).status_code == 401


def test_a_secret_rotated_in_another_process_takes_effect_for_the_next_request(side_a):
    note = side_a.notes[0]
    body, headers = signed(SECRET_A, event(note, "delivered"))
    assert post(side_a.provider.pk, body, headers).status_code == 200  # the view is now cached
    new = "whsec_" + base64.b64encode(b"d" * 32).decode()
    type(side_a.provider).objects.filter(pk=side_a.provider.pk).update(
        secrets={"signing_secret": new}, updated_at=timezone.now()
    )
    # The old secret, verified by the cached view, is refused: apply finds the provider changed.
    body, headers = signed(SECRET_A, event(side_a.notes[1], "delivered"))
    assert post(side_a.provider.pk, body, headers).status_code == 401
    side_a.notes[1].refresh_from_db()
    assert side_a.notes[1].receipt is None
    # The new one, refused by the cached view, verifies against a fresh read.
    body, headers = signed(new, event(side_a.notes[2], "delivered"))
    assert post(side_a.provider.pk, body, headers).status_code == 200


def test_no_endpoint_is_404_and_a_big_body_413(side_a, tenant_a):
    console = factories.provider(tenant_a, "con", kind="console", channel="email", config={})
    body, headers = signed(SECRET_A, event(side_a.notes[0]))
    assert post(999_999, body, headers).status_code == 404
    assert post(console.pk, body, headers).status_code == 404
    assert Client().get(f"/hooks/providers/{side_a.provider.pk}").status_code == 405
    big = b"x" * (MAX_BODY_BYTES + 1)
    response = post(side_a.provider.pk, big, signed_raw(SECRET_A, b"x"))
    assert response.status_code == 413
    assert nothing_stored()


def test_a_flood_to_one_provider_is_429_with_retry_after_and_stores_nothing(side_a, side_b, settings):
    settings.OMNIPOST_RATE_LIMIT_RECEIPTS = 2  # a burst of 2, then 2 a second
    answers = []
    for note in side_a.notes:
        body, headers = signed(SECRET_A, event(note, "delivered"))
        answers.append(post(side_a.provider.pk, body, headers))
    assert [a.status_code for a in answers[:2]] == [200, 200]
    refused = answers[2]
    assert refused.status_code == 429 and refused["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "rate_limited"
    side_a.notes[2].refresh_from_db()
    assert side_a.notes[2].receipt is None  # the vendor retries it later
    # Another provider's URL has its own bucket.
    body, headers = signed(SECRET_B, event(side_b.notes[0], "delivered"))
    assert post(side_b.provider.pk, body, headers).status_code == 200
