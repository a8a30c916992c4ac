"""A push to a subscriber's devices with real dispatcher processes against the vendors' stand-ins
(tests.push.standins: APNs over HTTP/2 and TLS, FCM behind its OAuth grant, Web Push decrypted with
http_ece): one notification reaches every device of each kind; a dead token is deactivated at its first
answer (with a `device.deactivated` event) and never sent a later notification; a 503 on one device
retries that device only; a dispatcher killed mid-send leaves what a device accepted unsent again."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from events.models import Event
from notifications.models import DeliveryAttempt, Notification, NotificationDevice
from recipients.models import Device
from tests.push.standins import Answer
from tests.queueing.dispatch_support import drain, start_dispatchers, wait_exit, wait_started, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

IOS = "a1" * 32
IOS_DEAD = "dd" * 32
ANDROID = "fcm-token-android-1"


def providers(api, standins) -> None:
    apns, fcm, webpush = standins
    for order, (name, kind, standin) in enumerate((("ios", "apns", apns), ("android", "fcm", fcm),
                                                   ("browsers", "webpush", webpush)), start=1):  # fmt: skip
        config, secrets = standin.provider_config()
        made = api.post("/api/v1/providers", {"name": name, "channel": "push", "kind": kind, "config": config,
                                              "secrets": secrets, "failover_order": order}, format="json")  # fmt: skip
        assert made.status_code == 201, made.content


def register(api, subscriber: str, **device: object) -> str:
    made = api.post(f"/api/v1/subscribers/{subscriber}/devices", device, format="json")
    assert made.status_code in (200, 201), made.content
    return made.json()["id"]


def notify(api, subscriber: str, subject: str, **push: object) -> str:
    made = api.post("/api/v1/notifications", {"channel": "push", "subscriber": subscriber, "subject": subject,
                                              "body": f"{subject}!", **push}, format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    assert made.json()["status"] == "queued"
    return made.json()["id"]


def detail(api, notification_id: str) -> dict:
    response = api.get(f"/api/v1/notifications/{notification_id}")
    assert response.status_code == 200
    return response.json()


def test_one_notification_reaches_a_device_of_each_kind(api_a, standins, push_env, tmp_path):
    apns, fcm, webpush = standins
    providers(api_a, standins)
    assert api_a.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    ids = {
        "apns": register(api_a, "jane", kind="apns", token=IOS),
        "fcm": register(api_a, "jane", kind="fcm", token=ANDROID),
        "webpush": register(api_a, "jane", kind="webpush", subscription=webpush.subscribe("jane").as_json()),
    }
    sent = notify(api_a, "jane", "Shipped", data={"order": "42"}, badge=1, collapse_key="order-42")
    drain(push_env, tmp_path / "run", batch_size=10)

    body = detail(api_a, sent)
    assert body["status"] == "delivered", body
    assert sorted((d["kind"], d["status"], d["device_id"]) for d in body["devices"]) == sorted(
        (kind, "delivered", device_id) for kind, device_id in ids.items()
    )
    assert [a["outcome"] for a in body["attempts"]] == ["delivered"]
    assert [r["payload"]["aps"]["alert"] for r in apns.accepted(IOS)] == [{"title": "Shipped", "body": "Shipped!"}]
    assert apns.accepted(IOS)[0]["payload"]["order"] == "42"
    assert [r["message"]["data"] for r in fcm.accepted(ANDROID)] == [{"order": "42"}]
    assert [r["payload"] for r in webpush.accepted("jane")] == [
        {"title": "Shipped", "body": "Shipped!", "data": {"order": "42"}, "badge": 1}
    ]
    assert apns.refused == fcm.refused == webpush.refused == []
    assert Device.objects.filter(last_used_at__isnull=False).count() == 3
    assert fcm.grants == 1


def test_a_dead_token_is_deactivated_at_once_and_never_sent_again(api_a, standins, push_env, tmp_path):
    apns, fcm, webpush = standins
    providers(api_a, standins)
    hooks = api_a.post("/api/v1/event-endpoints", {"name": "ops", "url": "http://127.0.0.1:9/events",
                                                   "event_types": ["device.deactivated"]}, format="json")  # fmt: skip
    assert hooks.status_code == 201, hooks.content
    assert api_a.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    alive = register(api_a, "jane", kind="apns", token=IOS)
    dead = register(api_a, "jane", kind="apns", token=IOS_DEAD)
    gone = register(api_a, "jane", kind="fcm", token=ANDROID)
    apns.answer(IOS_DEAD, Answer(410))
    fcm.answer(ANDROID, Answer(404))
    first = notify(api_a, "jane", "One")
    drain(push_env, tmp_path / "run1", batch_size=10)

    body = detail(api_a, first)
    assert body["status"] == "delivered"
    shown = {d["device_id"]: (d["status"], d["error_code"]) for d in body["devices"]}
    assert shown == {alive: ("delivered", None), dead: ("deactivated", "apns_Unregistered"),
                     gone: ("deactivated", "fcm_UNREGISTERED")}  # fmt: skip
    listed = {d["id"]: d for d in api_a.get("/api/v1/subscribers/jane/devices").json()["results"]}
    assert (listed[dead]["active"], listed[dead]["deactivated_reason"]) == (False, "Unregistered")
    assert (listed[gone]["active"], listed[gone]["deactivated_reason"]) == (False, "UNREGISTERED")
    assert listed[alive]["active"] is True
    events = sorted(
        (
            e.payload["data"]["device_id"],
            e.payload["data"]["reason"],
            e.payload["data"]["kind"],
            e.payload["data"]["subscriber"],
        )
        for e in Event.objects.filter(type="device.deactivated")
    )
    assert events == sorted([(dead, "Unregistered", "apns", "jane"), (gone, "UNREGISTERED", "fcm", "jane")])

    second = notify(api_a, "jane", "Two")
    drain(push_env, tmp_path / "run2", batch_size=10)
    assert detail(api_a, second)["status"] == "delivered"
    assert [d["device_id"] for d in detail(api_a, second)["devices"]] == [alive]
    assert apns.seen[IOS_DEAD] == 1 and fcm.seen[ANDROID] == 1 and apns.seen[IOS] == 2
    # a subscriber whose every device is dead is refused at creation
    api_a.put("/api/v1/subscribers/joe", {}, format="json")
    register(api_a, "joe", kind="apns", token=IOS_DEAD)  # moved to joe, and active again: re-registered
    Device.objects.filter(pk=dead).update(active=False, deactivated_reason="Unregistered")
    refused = api_a.post("/api/v1/notifications", {"channel": "push", "subscriber": "joe", "subject": "x",
                                                   "body": "y"}, format="json")  # fmt: skip
    assert refused.status_code == 400 and "subscriber" in refused.json()["error"]["details"]


def test_a_503_on_one_device_retries_that_device_only(api_a, standins, push_env, tmp_path):
    apns, fcm, webpush = standins
    providers(api_a, standins)
    assert api_a.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    register(api_a, "jane", kind="apns", token=IOS)
    flaky = register(api_a, "jane", kind="fcm", token=ANDROID)
    register(api_a, "jane", kind="webpush", subscription=webpush.subscribe("jane").as_json())
    fcm.answer(ANDROID, Answer(503, headers={"retry-after": "1"}))
    sent = notify(api_a, "jane", "Retry")
    drain(push_env, tmp_path / "run", lambda: Notification.objects.get(pk=sent).status == "delivered", batch_size=10)

    body = detail(api_a, sent)
    assert [(a["number"], a["outcome"], a["error_code"]) for a in body["attempts"]] == [
        (1, "transient_error", "fcm_UNAVAILABLE"),
        (2, "delivered", ""),
    ]
    assert {d["device_id"]: d["status"] for d in body["devices"]}[flaky] == "delivered"
    assert apns.seen[IOS] == 1 and webpush.seen["jane"] == 1 and fcm.seen[ANDROID] == 2
    first, second = DeliveryAttempt.objects.filter(notification_id=sent).order_by("number")
    assert (second.started_at - first.finished_at).total_seconds() >= 0.9  # Retry-After honoured


def test_a_dispatcher_killed_mid_send_never_resends_what_a_device_accepted(api_a, standins, push_env, tmp_path):
    apns, fcm, webpush = standins
    providers(api_a, standins)
    assert api_a.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    register(api_a, "jane", kind="apns", token=IOS)
    register(api_a, "jane", kind="webpush", subscription=webpush.subscribe("jane").as_json())
    slow = register(api_a, "jane", kind="fcm", token=ANDROID)
    fcm.answer(ANDROID, Answer(delay=30))  # held until the dispatcher is killed
    sent = notify(api_a, "jane", "Kill")
    (tmp_path / "run1").mkdir()
    procs = start_dispatchers(1, push_env, "--batch-size", "10", log_dir=tmp_path / "run1")
    try:
        assert wait_started(tmp_path / "run1", 1)
        accepted = NotificationDevice.objects.filter(notification_id=sent, status="delivered")
        assert wait_until(lambda: accepted.count() == 2 and fcm.seen[ANDROID] == 1, 30)
        os.kill(procs[0].pid, signal.SIGKILL)
    finally:
        wait_exit(procs, 10)
    assert Notification.objects.get(pk=sent).status == "queued"  # nothing recorded but the devices
    drain(push_env, tmp_path / "run2", lambda: Notification.objects.get(pk=sent).status == "delivered", batch_size=10)

    assert apns.seen[IOS] == 1 and webpush.seen["jane"] == 1  # accepted before the kill: never again
    assert fcm.seen[ANDROID] == 2 and len(fcm.accepted(ANDROID)) == 1
    assert NotificationDevice.objects.get(notification_id=sent, device_id=slow).status == "delivered"
    assert time.time()  # the whole scenario within the test's timeout


def test_payload_limits_and_push_fields_are_checked_at_creation(api_a, standins):
    providers(api_a, standins)
    assert api_a.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    register(api_a, "jane", kind="apns", token=IOS)
    base = {"channel": "push", "subscriber": "jane", "subject": "s", "body": "b"}
    for extra, field in (
        ({"data": {"k": "v" * 4100}}, "data"),
        ({"body": "x" * 4100}, "body"),
        ({"data": {"k": 1}}, "data"),
        ({"badge": -1}, "badge"),
        ({"urgency": "low"}, "urgency"),
        ({"ttl_seconds": 10**9}, "ttl_seconds"),
        ({"collapse_key": "k" * 65}, "collapse_key"),
        ({"image_url": "ftp://x"}, "image_url"),
    ):
        response = api_a.post("/api/v1/notifications", {**base, **extra}, format="json")
        assert response.status_code == 400, (extra, response.content)
        assert field in response.json()["error"]["details"], (extra, response.json())
    response = api_a.post("/api/v1/notifications", {"channel": "email", "recipient": "a@example.com", "subject": "s",
                                                    "body": "b", "badge": 1}, format="json")  # fmt: skip
    assert response.status_code == 400 and "badge" in response.json()["error"]["details"]
    assert Notification.objects.count() == 0


def test_a_recipient_with_a_native_provider_goes_to_that_one_device(api_a, standins, push_env, tmp_path):
    apns, fcm, webpush = standins
    providers(api_a, standins)
    sub = webpush.subscribe("solo")
    made = api_a.post("/api/v1/notifications", {"channel": "push", "provider": "browsers", "subject": "Hi",
                                                "body": "there", "recipient": json.dumps(sub.as_json())},
                      format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    bad = api_a.post("/api/v1/notifications", {"channel": "push", "provider": "ios", "subject": "Hi", "body": "x",
                                               "recipient": "not-hex"}, format="json")  # fmt: skip
    assert bad.status_code == 400 and "recipient" in bad.json()["error"]["details"]
    drain(push_env, tmp_path / "run", batch_size=10)
    assert detail(api_a, made.json()["id"])["status"] == "delivered"
    assert [r["payload"]["title"] for r in webpush.accepted("solo")] == ["Hi"]
