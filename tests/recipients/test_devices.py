"""Push devices on subscribers: registered once per token per tenant (the same token again is the same
device, moved to the subscriber that registers it), encrypted at rest, masked on every output (a Web
Push endpoint shows no path), Web Push endpoints held to the SSRF rules, another tenant's is 404."""

from __future__ import annotations

import base64
import secrets

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from core.models import AuditEvent
from recipients.models import Device, Subscriber

pytestmark = pytest.mark.django_db

APNS_TOKEN = "ab12" * 16  # 64 hex digits
FCM_TOKEN = "fcm-canary:APA91bH" + "x" * 60 + "9f2c"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def subscription(endpoint: str = "https://push.example.net/wpush/v2/canary-path-77") -> dict:
    key = ec.generate_private_key(ec.SECP256R1())
    point = key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return {"endpoint": endpoint, "keys": {"p256dh": b64url(point), "auth": b64url(secrets.token_bytes(16))}}


@pytest.fixture
def jane(api_a):
    assert api_a.put("/api/v1/subscribers/jane", {"email": "jane@example.com"}, format="json").status_code == 201
    assert api_a.put("/api/v1/subscribers/joe", {}, format="json").status_code == 201
    return "jane"


def devices_of(api, external_id: str) -> list[dict]:
    response = api.get(f"/api/v1/subscribers/{external_id}/devices")
    assert response.status_code == 200
    return response.json()["results"]


def test_register_list_and_the_same_token_again(api_a, jane):
    made = api_a.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN}, format="json")
    assert made.status_code == 201, made.content
    body = made.json()
    assert set(body) == {"id", "kind", "token_masked", "active", "deactivated_reason", "created_at", "last_used_at"}
    assert body["kind"] == "fcm" and body["active"] is True and body["deactivated_reason"] is None
    assert body["token_masked"] == "****9f2c" and FCM_TOKEN not in made.content.decode()
    again = api_a.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN}, format="json")
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    assert [d["id"] for d in devices_of(api_a, "jane")] == [body["id"]]
    actions = list(AuditEvent.objects.filter(target_type="recipients.device").values_list("action", flat=True))
    assert sorted(actions) == ["device.registered", "device.reregistered"]


def test_a_token_registered_by_another_subscriber_moves_there(api_a, jane):
    first = api_a.post("/api/v1/subscribers/jane/devices", {"kind": "apns", "token": APNS_TOKEN}, format="json")
    assert first.status_code == 201
    moved = api_a.post("/api/v1/subscribers/joe/devices", {"kind": "apns", "token": APNS_TOKEN.upper()},
                       format="json")  # fmt: skip
    assert moved.status_code == 200 and moved.json()["id"] == first.json()["id"]
    assert devices_of(api_a, "jane") == []
    assert [d["id"] for d in devices_of(api_a, "joe")] == [first.json()["id"]]
    assert Device.objects.count() == 1


def test_a_deactivated_device_registered_again_is_active_again(api_a, jane):
    made = api_a.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN}, format="json")
    Device.objects.filter(pk=made.json()["id"]).update(active=False, deactivated_reason="UNREGISTERED")
    assert devices_of(api_a, "jane")[0]["deactivated_reason"] == "UNREGISTERED"
    again = api_a.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN}, format="json")
    assert again.status_code == 200 and again.json()["active"] is True and again.json()["deactivated_reason"] is None


def test_tokens_and_subscriptions_are_encrypted_at_rest_and_indexed_blind(api_a, jane):
    sub = subscription()
    api_a.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN}, format="json")
    made = api_a.post("/api/v1/subscribers/jane/devices", {"kind": "webpush", "subscription": sub}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["token_masked"] == "https://push.example.net/****"
    with connection.cursor() as cursor:
        cursor.execute("SELECT token, token_masked, token_index FROM devices")
        rows = cursor.fetchall()
    stored = repr(rows)
    for secret in (FCM_TOKEN, "canary-path-77", sub["keys"]["auth"], sub["keys"]["p256dh"]):
        assert secret not in stored
    device = Device.objects.get(kind="webpush")
    assert device.token.startswith('{"endpoint":"https://push.example.net/wpush/v2/canary-path-77"')


def test_another_tenants_subscriber_and_device_are_404(api_a, api_b, jane):
    made = api_a.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN}, format="json")
    device_id = made.json()["id"]
    assert api_b.get("/api/v1/subscribers/jane/devices").status_code == 404
    assert api_b.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN},
                      format="json").status_code == 404  # fmt: skip
    assert api_b.delete(f"/api/v1/subscribers/jane/devices/{device_id}").status_code == 404
    # the same token in another tenant is that tenant's own device
    assert api_b.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    theirs = api_b.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN}, format="json")
    assert theirs.status_code == 201 and theirs.json()["id"] != device_id
    assert api_b.delete(f"/api/v1/subscribers/jane/devices/{device_id}").status_code == 404
    assert api_a.delete(f"/api/v1/subscribers/joe/devices/{device_id}").status_code == 404  # not joe's
    assert api_a.delete(f"/api/v1/subscribers/jane/devices/{device_id}").status_code == 204
    assert api_a.delete(f"/api/v1/subscribers/jane/devices/{device_id}").status_code == 404
    assert devices_of(api_a, "jane") == [] and len(devices_of(api_b, "jane")) == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "sms", "token": "x"}, "kind"),
        ({"kind": "apns", "token": "not-hex"}, "token"),
        ({"kind": "apns", "token": "ab" * 10}, "token"),
        ({"kind": "fcm", "token": "has space"}, "token"),
        ({"kind": "fcm"}, "token"),
        ({"kind": "fcm", "token": "abc", "extra": 1}, "extra"),
        ({"kind": "fcm", "token": "abc", "subscription": {}}, "subscription"),
        ({"kind": "webpush", "token": "abc"}, "token"),
        ({"kind": "webpush", "subscription": {"endpoint": "ftp://x.example/1", "keys": subscription()["keys"]}},
         "subscription.endpoint"),
        ({"kind": "webpush", "subscription": {"endpoint": "https://x.example/1",
                                              "keys": {"p256dh": b64url(b"\x04" + b"1" * 64), "auth": "AAAA"}}},
         "subscription.keys.p256dh"),
        ({"kind": "webpush", "subscription": {"endpoint": "https://x.example/1",
                                              "keys": {**subscription()["keys"], "auth": b64url(b"short")}}},
         "subscription.keys.auth"),
    ],
)  # fmt: skip
def test_bad_registrations_are_400_naming_the_field(api_a, jane, body, field):
    response = api_a.post("/api/v1/subscribers/jane/devices", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"]
    assert Device.objects.count() == 0


def test_a_webpush_endpoint_on_a_private_address_is_refused(api_a, jane, settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    for endpoint in ("https://127.0.0.1:8443/push/1", "https://[::1]/push/2", "https://10.1.2.3/push/3",
                     "http://push.example.net/push/4"):  # fmt: skip
        response = api_a.post("/api/v1/subscribers/jane/devices",
                              {"kind": "webpush", "subscription": subscription(endpoint)}, format="json")  # fmt: skip
        assert response.status_code == 400, endpoint
        assert "subscription.endpoint" in response.json()["error"]["details"]
    assert Device.objects.count() == 0


def test_unknown_subscriber_is_404(api_a):
    assert api_a.get("/api/v1/subscribers/nobody/devices").status_code == 404
    assert api_a.post("/api/v1/subscribers/nobody/devices", {"kind": "fcm", "token": FCM_TOKEN},
                      format="json").status_code == 404  # fmt: skip


def test_deleting_the_subscriber_deletes_its_devices(api_a, jane):
    api_a.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN}, format="json")
    assert api_a.delete("/api/v1/subscribers/jane").status_code == 204
    assert Device.objects.count() == 0


def test_the_subscriber_page_shows_devices_masked_only(api_a, jane, tenant_a):
    sub = subscription()
    api_a.post("/api/v1/subscribers/jane/devices", {"kind": "fcm", "token": FCM_TOKEN}, format="json")
    api_a.post("/api/v1/subscribers/jane/devices", {"kind": "webpush", "subscription": sub}, format="json")
    admin = get_user_model().objects.create_superuser("root", "root@example.test", "pw-unused-123")
    client = Client()
    client.force_login(admin)
    subscriber_id = Subscriber.objects.get(tenant=tenant_a, external_id="jane").pk
    page = client.get(f"/admin/recipients/subscriber/{subscriber_id}/change/").content.decode()
    assert "****9f2c" in page and "https://push.example.net/****" in page
    for secret in (FCM_TOKEN, "canary-path-77", sub["keys"]["auth"]):
        assert secret not in page
