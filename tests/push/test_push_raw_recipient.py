"""A push to a raw token (a `recipient` with a native push provider) that the vendor calls dead
deactivates the tenant's device with that token, as the push to a subscriber's devices does: the
device is never sent a later notification, and `device.deactivated` is emitted. Real dispatcher
processes against the vendors' stand-ins."""

from __future__ import annotations

import json

import pytest

from events.models import Event
from notifications.models import Notification
from recipients.models import Device
from tests.push.standins import Answer
from tests.push.test_push_end_to_end import detail, drain, notify, register
from tests.push.test_push_failover import IOS, IOS_OTHER, provider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ANDROID = "fcm-token-android-1"


def test_a_raw_token_the_vendor_calls_dead_deactivates_its_device(api_a, standins, push_env, tmp_path):
    apns, fcm, webpush = standins
    provider(api_a, "ios", "apns", apns, 1)
    provider(api_a, "android", "fcm", fcm, 2)
    provider(api_a, "browsers", "webpush", webpush, 3)
    assert api_a.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    dead_ios = register(api_a, "jane", kind="apns", token=IOS)
    alive_ios = register(api_a, "jane", kind="apns", token=IOS_OTHER)
    dead_fcm = register(api_a, "jane", kind="fcm", token=ANDROID)
    subscription = webpush.subscribe("gone")
    dead_browser = register(api_a, "jane", kind="webpush", subscription=subscription.as_json())
    apns.answer(IOS, Answer(410, reason="Unregistered"))
    fcm.answer(ANDROID, Answer(404))
    webpush.answer("gone", Answer(410))
    hooks = api_a.post("/api/v1/event-endpoints", {"name": "ops", "url": "http://127.0.0.1:9/events",
                                                   "event_types": ["device.deactivated"]}, format="json")  # fmt: skip
    assert hooks.status_code == 201, hooks.content
    raw = [("ios", IOS), ("android", ANDROID), ("browsers", json.dumps(subscription.as_json())),
           ("ios", IOS_OTHER)]  # fmt: skip
    sent = []
    for name, recipient in raw:
        made = api_a.post("/api/v1/notifications", {"channel": "push", "provider": name, "subject": "Raw",
                                                    "body": "x", "recipient": recipient}, format="json")  # fmt: skip
        assert made.status_code == 201, made.content
        sent.append(made.json()["id"])
    drain(push_env, tmp_path / "run")

    assert [Notification.objects.get(pk=n).status for n in sent] == ["failed", "failed", "failed", "delivered"]
    devices = {str(d.pk): (d.active, d.deactivated_reason) for d in Device.objects.all()}
    assert devices == {dead_ios: (False, "Unregistered"), dead_fcm: (False, "UNREGISTERED"),
                       dead_browser: (False, "http_410"), alive_ios: (True, None)}  # fmt: skip
    events = sorted((e.payload["data"]["device_id"], e.payload["data"]["kind"])
                    for e in Event.objects.filter(type="device.deactivated"))  # fmt: skip
    assert events == sorted([(dead_ios, "apns"), (dead_fcm, "fcm"), (dead_browser, "webpush")])

    # a later push to the subscriber goes to the live device only
    later = notify(api_a, "jane", "Later")
    drain(push_env, tmp_path / "run2")
    assert [d["device_id"] for d in detail(api_a, later)["devices"]] == [alive_ios]
    assert apns.seen[IOS] == 1 and fcm.seen[ANDROID] == 1 and webpush.seen["gone"] == 1
