"""`event-endpoints` through the API: secret shown once, validation, PATCH, recover, attempts, BOLA."""

from __future__ import annotations

import base64
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from core.models import AuditEvent
from events import emit
from events.models import DeliveryStatus, Event, EventAttempt, EventDelivery, EventEndpoint, public_event_id
from tests.support.outbox import fan_out
from tests.support.receivers import TEST_SIGNING_SECRET

pytestmark = pytest.mark.django_db

URL = "/api/v1/event-endpoints"


def body(**extra: object) -> dict:
    return {"name": "ops", "url": "http://127.0.0.1:9/events", "event_types": ["notification.delivered"], **extra}


def test_a_generated_secret_is_shown_once_in_the_201_then_never(api_a, tenant_a):
    response = api_a.post(URL, body(), format="json")
    assert response.status_code == 201, response.content
    secret = response.json()["secret"]
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) >= 24
    assert response.json()["enabled"] is True and response.json()["event_types"] == ["notification.delivered"]
    detail = api_a.get(f"{URL}/ops")
    assert detail.status_code == 200 and "secret" not in detail.json() and secret not in detail.content.decode()
    assert secret not in api_a.get(URL).content.decode()
    assert EventEndpoint.objects.get(name="ops").secret == secret
    with connection.cursor() as cursor:  # encrypted at rest
        cursor.execute("SELECT secret FROM event_endpoints WHERE name = 'ops'")
        assert secret not in cursor.fetchone()[0]
    event = AuditEvent.objects.get(action="event_endpoint.created")
    assert event.tenant_id == tenant_a.pk and secret not in str(event.details)


def test_a_client_supplied_secret_is_not_echoed(api_a):
    response = api_a.post(URL, body(secret=TEST_SIGNING_SECRET, event_types=["*"]), format="json")
    assert response.status_code == 201, response.content
    assert "secret" not in response.json() and TEST_SIGNING_SECRET not in response.content.decode()
    assert EventEndpoint.objects.get(name="ops").secret == TEST_SIGNING_SECRET


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (body(event_types=["notification.opened"]), "event_types"),
        (body(event_types=[]), "event_types"),
        (body(event_types=["*", "notification.failed"]), "event_types"),
        (body(url="ftp://example.com/x"), "url"),
        (body(secret="plain"), "secret"),
        (body(name="has space"), "name"),
        (body(enabled="yes"), "enabled"),
        (body(status="delivered"), "status"),
    ],
)
def test_validation(api_a, payload, field):
    response = api_a.post(URL, payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"]


@override_settings(OMNIPOST_ALLOW_PRIVATE_DESTINATIONS=False)
@pytest.mark.parametrize("url", ["http://127.0.0.1/x", "http://10.1.2.3/x", "http://169.254.169.254/latest"])
def test_private_destinations_are_refused_like_webhook_providers(api_a, url):
    response = api_a.post(URL, body(url=url), format="json")
    assert response.status_code == 400 and "url" in response.json()["error"]["details"]


def test_duplicate_name_is_409(api_a):
    assert api_a.post(URL, body(), format="json").status_code == 201
    assert api_a.post(URL, body(), format="json").status_code == 409


def test_another_tenants_endpoint_is_404_everywhere(api_a, api_b):
    assert api_a.post(URL, body(), format="json").status_code == 201
    assert api_b.get(f"{URL}/ops").status_code == 404
    assert api_b.patch(f"{URL}/ops", {"enabled": False}, format="json").status_code == 404
    assert api_b.delete(f"{URL}/ops").status_code == 404
    assert api_b.post(f"{URL}/ops/recover", {"since": "2020-01-01T00:00:00Z"}, format="json").status_code == 404
    assert api_b.get(f"{URL}/ops/attempts").status_code == 404
    assert api_b.get(URL).json()["results"] == []
    assert EventEndpoint.objects.get(name="ops").enabled is True


def test_patch_rotates_the_secret_with_an_audit_event_and_keeps_the_name(api_a):
    first = api_a.post(URL, body(), format="json").json()["secret"]
    new = "whsec_" + base64.b64encode(b"n" * 32).decode()
    response = api_a.patch(f"{URL}/ops", {"secret": new, "event_types": ["*"]}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["event_types"] == ["*"] and new not in response.content.decode()
    endpoint = EventEndpoint.objects.get(name="ops")
    assert endpoint.secret == new and endpoint.previous_secret == first and endpoint.rotation_until() is not None
    assert AuditEvent.objects.filter(action="event_endpoint.secret_rotated").count() == 1
    assert api_a.patch(f"{URL}/ops", {"name": "other"}, format="json").status_code == 400


def test_delete_is_204_and_audited(api_a):
    api_a.post(URL, body(), format="json")
    assert api_a.delete(f"{URL}/ops").status_code == 204
    assert not EventEndpoint.objects.exists()
    assert AuditEvent.objects.filter(action="event_endpoint.deleted").count() == 1


def _deliveries(tenant, count=2):
    ids = emit.emit(None, tenant.pk, "notification.delivered",
                    [{"notification_id": f"n{i}", "status": "delivered"} for i in range(count)])  # fmt: skip
    assert fan_out() == count  # as the event lane does: the events are in the endpoints' queues
    return ids


def test_reenabling_does_not_resend_and_recover_does_with_the_original_ids(api_a, tenant_a):
    api_a.post(URL, body(), format="json")
    ids = _deliveries(tenant_a)
    endpoint = EventEndpoint.objects.get(name="ops")
    EventEndpoint.objects.filter(pk=endpoint.pk).update(enabled=False, disabled_reason="failing for 120 hours")
    assert api_a.post(f"{URL}/ops/recover", {"since": "2020-01-01T00:00:00Z"}, format="json").status_code == 409
    response = api_a.patch(f"{URL}/ops", {"enabled": True}, format="json")
    assert response.json()["enabled"] is True and response.json()["disabled_reason"] == ""
    # kept, but not sent again by re-enabling
    assert set(EventDelivery.objects.values_list("status", flat=True)) == {DeliveryStatus.FAILED}
    since = (timezone.now() - timedelta(minutes=1)).isoformat()
    response = api_a.post(f"{URL}/ops/recover", {"since": since}, format="json")
    assert response.status_code == 202 and response.json() == {"queued": 2}
    pending = EventDelivery.objects.filter(status=DeliveryStatus.PENDING)
    assert sorted(public_event_id(e) for e in pending.values_list("event_id", flat=True)) == sorted(ids)
    # a delivered event is not re-sent; a future `since` finds nothing
    assert api_a.post(f"{URL}/ops/recover", {"since": (timezone.now() + timedelta(hours=1)).isoformat()},
                      format="json").json() == {"queued": 0}  # fmt: skip
    assert api_a.post(f"{URL}/ops/recover", {"since": "yesterday"}, format="json").status_code == 400


def test_recover_also_sends_events_made_while_the_endpoint_did_not_receive_them(api_a, tenant_a):
    api_a.post(URL, body(), format="json")
    api_a.post(URL, body(name="late", event_types=["notification.failed"]), format="json")
    ids = _deliveries(tenant_a, 1)
    api_a.patch(f"{URL}/late", {"event_types": ["*"]}, format="json")
    response = api_a.post(f"{URL}/late/recover", {"since": "2020-01-01T00:00:00Z"}, format="json")
    assert response.json() == {"queued": 1}
    assert public_event_id(EventDelivery.objects.get(endpoint__name="late").event_id) == ids[0]


def test_attempts_newest_first_and_paginated(api_a, tenant_a):
    api_a.post(URL, body(), format="json")
    (event_id,) = _deliveries(tenant_a, 1)
    endpoint = EventEndpoint.objects.get(name="ops")
    now = timezone.now()
    EventAttempt.objects.bulk_create([
        EventAttempt(tenant=tenant_a, event_id=uuid.UUID(event_id[4:]), endpoint=endpoint,
                     event_type="notification.delivered", status="failed" if i < 2 else "delivered",
                     http_status=503 if i < 2 else 200, duration_ms=i, attempted_at=now + timedelta(seconds=i))
        for i in range(3)
    ])  # fmt: skip
    page = api_a.get(f"{URL}/ops/attempts?limit=2").json()
    assert [a["status"] for a in page["results"]] == ["delivered", "failed"]
    assert page["results"][0] == {
        "event_id": event_id, "type": "notification.delivered", "status": "delivered", "http_status": 200,
        "duration_ms": 2, "attempted_at": page["results"][0]["attempted_at"],
    }  # fmt: skip
    rest = api_a.get(page["next"]).json()
    assert [a["duration_ms"] for a in rest["results"]] == [0] and rest["next"] is None
    assert api_a.get(f"{URL}/ops/attempts?status=x").status_code == 400


def test_emit_writes_nothing_for_unsubscribed_types_and_refuses_plain_recipients(api_a, tenant_a, tenant_b):
    api_a.post(URL, body(), format="json")
    assert emit.emit(None, tenant_a.pk, "notification.failed", [{"notification_id": "x"}]) == []
    assert emit.emit(None, tenant_b.pk, "notification.delivered", [{"notification_id": "x"}]) == []
    with pytest.raises(ValueError, match="recipient"):
        emit.emit(None, tenant_a.pk, "notification.delivered", [{"recipient": "a@example.com"}])
    (event_id,) = emit.emit(None, tenant_a.pk, "notification.delivered", [{"notification_id": "x", "channel": "sms"}])
    event = Event.objects.get()
    assert event.fanout_pending and not EventDelivery.objects.exists()  # the outbox: the lane fans it out
    payload = event.payload
    assert event_id.startswith("evt_") and event.public_id == event_id
    assert payload["type"] == "notification.delivered" and payload["timestamp"].endswith("Z")
    assert payload["data"]["channel"] == "sms" and payload["data"]["receipt"] is None
    assert set(payload["data"]) == set(emit.NOTIFICATION_FIELDS)
