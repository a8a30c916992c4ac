"""Failover between push providers of the same kind, with real dispatcher processes against the
vendors' stand-ins: a device whose APNs provider answers 503 is delivered through the tenant's second
APNs provider on its next try (and only that device moves); a provider whose breaker is open is
passed over at claim time; a push never fails over to a provider of another kind, nor past a
provider the client named."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from notifications.models import Notification, NotificationDevice
from providers.models import Provider
from routing.models import ProviderCircuit
from tests.push.standins import Answer, ApnsStandIn, FcmStandIn
from tests.push.test_push_end_to_end import detail, drain, notify, register

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

IOS = "a1" * 32
IOS_OTHER = "b2" * 32
ANDROID = "fcm-token-android-1"


def mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.fixture
def two_apns(tmp_path):
    first, second = ApnsStandIn(mkdir(tmp_path / "a")).start(), ApnsStandIn(mkdir(tmp_path / "b")).start()
    fcm = FcmStandIn().start()
    yield first, second, fcm
    for standin in (first, second, fcm):
        standin.stop()


def provider(api, name: str, kind: str, standin, order: int) -> int:  # noqa: ANN001
    config, secrets = standin.provider_config()
    made = api.post("/api/v1/providers", {"name": name, "channel": "push", "kind": kind, "config": config,
                                          "secrets": secrets, "failover_order": order}, format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    return made.json()["id"]


def test_a_device_whose_provider_answers_503_is_delivered_through_the_next_of_its_kind(
    api_a, two_apns, push_env, tmp_path
):
    first, second, fcm = two_apns
    # the push order mixes kinds: APNs fails over to APNs only, never to the FCM provider between them
    ios_a = provider(api_a, "ios-a", "apns", first, 1)
    provider(api_a, "android", "fcm", fcm, 2)
    ios_b = provider(api_a, "ios-b", "apns", second, 3)
    assert api_a.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    phone = register(api_a, "jane", kind="apns", token=IOS)
    tablet = register(api_a, "jane", kind="fcm", token=ANDROID)
    first.answer(IOS, *[Answer(503, reason="ServiceUnavailable")] * 5)  # down for as long as the test runs
    sent = notify(api_a, "jane", "Failover")
    drain(push_env, tmp_path / "run", until=lambda: Notification.objects.get(pk=sent).status == "delivered")

    body = detail(api_a, sent)
    assert [(a["number"], a["outcome"], a["provider"]) for a in body["attempts"]] == [
        (1, "transient_error", "ios-a"),
        (2, "delivered", "ios-b"),
    ]
    assert {d["device_id"]: d["status"] for d in body["devices"]} == {phone: "delivered", tablet: "delivered"}
    assert first.seen[IOS] == 1 and [r["payload"]["aps"]["alert"]["title"] for r in second.accepted(IOS)] == [
        "Failover"
    ]
    assert fcm.seen[ANDROID] == 1  # accepted on the first try: never sent again
    assert fcm.seen[IOS] == 0  # an APNs token is never handed to FCM
    rows = NotificationDevice.objects.filter(notification_id=sent).values_list("device_id", "provider_id")
    through = {str(device): pid for device, pid in rows}
    assert through[phone] == ios_b and through[tablet] == Provider.objects.get(name="android").pk
    assert ios_a != ios_b


def test_a_provider_with_an_open_breaker_is_passed_over_at_claim_time(api_a, two_apns, push_env, tmp_path):
    first, second, fcm = two_apns
    ios_a = provider(api_a, "ios-a", "apns", first, 1)
    provider(api_a, "ios-b", "apns", second, 2)
    assert api_a.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    register(api_a, "jane", kind="apns", token=IOS)
    register(api_a, "jane", kind="apns", token=IOS_OTHER)
    now = timezone.now()
    ProviderCircuit.objects.create(provider_id=ios_a, state="open", opened_at=now, window_started_at=now,
                                   updated_at=now)  # fmt: skip
    sent = notify(api_a, "jane", "Around")
    drain(push_env, tmp_path / "run")

    body = detail(api_a, sent)
    assert body["status"] == "delivered"
    assert [(a["outcome"], a["provider"]) for a in body["attempts"]] == [("delivered", "ios-b")]
    assert first.seen == {} and sorted(r["token"] for r in second.received) == sorted([IOS, IOS_OTHER])


def test_a_named_provider_never_fails_over(api_a, two_apns, push_env, tmp_path):
    first, second, fcm = two_apns
    provider(api_a, "ios-a", "apns", first, 1)
    provider(api_a, "ios-b", "apns", second, 2)
    Provider.objects.filter(name="ios-a").update(max_attempts=2)
    assert api_a.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    register(api_a, "jane", kind="apns", token=IOS)
    first.answer(IOS, *[Answer(503, reason="ServiceUnavailable")] * 5)
    made = api_a.post("/api/v1/notifications", {"channel": "push", "subscriber": "jane", "provider": "ios-a",
                                                "subject": "Pinned", "body": "x"}, format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    sent = made.json()["id"]
    drain(push_env, tmp_path / "run", until=lambda: Notification.objects.get(pk=sent).status == "dead_lettered")
    assert first.seen[IOS] == 2 and second.seen == {}
