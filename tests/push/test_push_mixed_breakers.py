"""Breakers and rate limits per device provider when one push fans out to devices of several kinds
(real dispatcher processes, the vendors' stand-ins): an APNs provider that answers 503 to everything
has its own breaker opened, while the FCM and Web Push devices of the same notifications are
delivered at once and their providers' breakers stay closed: each device's send counts (counters,
breaker) against the provider it went through, not the one the push item was on."""

from __future__ import annotations

import pytest
from django.db.models import Sum

from notifications.counters import ATTEMPTS, DeliveryCounter
from notifications.models import DeliveryAttempt, Notification, NotificationDevice
from routing.models import ProviderCircuit
from tests.push.standins import Answer
from tests.push.test_push_end_to_end import drain, notify, register

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

PEOPLE = 4


def provider(api, name: str, kind: str, standin, order: int, **extra: object) -> int:  # noqa: ANN001
    config, secrets = standin.provider_config()
    body = {"name": name, "channel": "push", "kind": kind, "config": config, "secrets": secrets,
            "failover_order": order, **extra}  # fmt: skip
    made = api.post("/api/v1/providers", body, format="json")
    assert made.status_code == 201, made.content
    return made.json()["id"]


def test_a_failing_apns_provider_opens_its_own_breaker_and_the_other_kinds_still_go(
    api_a, standins, push_env, tmp_path
):
    apns, fcm, webpush = standins
    # the APNs provider last in the push order: the push items start on the FCM provider
    # and every breaker quick to open: two sends, half of them failed
    circuit = {"min_requests": 2, "failure_threshold": 0.5, "open_seconds": 600}
    android = provider(api_a, "android", "fcm", fcm, 1, circuit=circuit)
    browsers = provider(api_a, "browsers", "webpush", webpush, 2, circuit=circuit)
    ios = provider(api_a, "ios", "apns", apns, 3, circuit=circuit)
    tokens, sent = [], []
    for i in range(PEOPLE):
        person = f"p{i}"
        assert api_a.put(f"/api/v1/subscribers/{person}", {}, format="json").status_code == 201
        token = f"{i + 1:02x}" * 32
        apns.answer(token, *[Answer(503, reason="ServiceUnavailable")] * 50)
        tokens.append(token)
        # (the APNs device registered last, so that nothing starts on it by being first)
        register(api_a, person, kind="fcm", token=f"fcm-{person}")
        register(api_a, person, kind="webpush", subscription=webpush.subscribe(person).as_json())
        register(api_a, person, kind="apns", token=token)
        sent.append(notify(api_a, person, f"Mixed {i}"))

    def settled() -> bool:
        open_now = ProviderCircuit.objects.filter(provider_id=ios, state="open").exists()
        others = NotificationDevice.objects.filter(notification_id__in=sent).exclude(kind="apns")
        return open_now and others.count() == 2 * PEOPLE and all(d.status == "delivered" for d in others)

    drain(push_env, tmp_path / "run", until=settled)

    # the APNs breaker is open; FCM's and Web Push's never opened though their pushes had a device failing
    states = dict(ProviderCircuit.objects.values_list("provider_id", "state"))
    assert states[ios] == "open"
    assert states.get(android, "closed") == "closed" and states.get(browsers, "closed") == "closed"
    # each FCM and Web Push device got each push once; the APNs devices are still pending (held
    # while the breaker is open), never delivered, and the apns stand-in saw no more than the
    # sends it took to open the breaker
    assert sorted(fcm.seen) == sorted(f"fcm-p{i}" for i in range(PEOPLE)) and set(fcm.seen.values()) == {1}
    assert len(webpush.received) == PEOPLE and webpush.refused == []
    ios_devices = NotificationDevice.objects.filter(notification_id__in=sent, kind="apns")
    assert {d.status for d in ios_devices} == {"pending"}
    assert apns.received == [] and sum(apns.seen[t] for t in tokens) >= 2
    assert all(Notification.objects.get(pk=n).status != "delivered" for n in sent)
    # each send counted against the provider it went through (the push items were on the FCM provider)
    rows = DeliveryCounter.objects.filter(le=ATTEMPTS).values("provider_id", "outcome").annotate(n=Sum("count"))
    counted = {(r["provider_id"], r["outcome"]): r["n"] for r in rows}
    assert counted[(android, "delivered")] == PEOPLE and counted[(browsers, "delivered")] == PEOPLE
    assert counted[(ios, "transient_error")] >= 2
    assert (android, "transient_error") not in counted and (browsers, "transient_error") not in counted
    assert DeliveryAttempt.objects.filter(notification_id__in=sent, provider_id=android).exists()


def test_the_apns_provider_s_rate_limit_spaces_its_devices_sends_while_the_fcm_devices_go(
    api_a, standins, push_env, tmp_path
):
    apns, fcm, _ = standins
    rate = 2.0
    android = provider(api_a, "android", "fcm", fcm, 1)  # the push items' provider: no limit
    provider(api_a, "ios", "apns", apns, 2, rate_limit={"rate_per_second": rate, "burst": 1})
    sent = []
    for i in range(6):
        person = f"r{i}"
        assert api_a.put(f"/api/v1/subscribers/{person}", {}, format="json").status_code == 201
        register(api_a, person, kind="fcm", token=f"fcm-{person}")
        register(api_a, person, kind="apns", token=f"{i + 1:02x}" * 32)
        sent.append(notify(api_a, person, f"Limited {i}"))

    drain(push_env, tmp_path / "run",
          until=lambda: all(n.status == "delivered" for n in Notification.objects.filter(pk__in=sent)))  # fmt: skip

    # every device got its push once; the APNs sends never outran the provider's bucket (one token at
    # first, then `rate` a second) although all six pushes were claimed at once
    assert set(fcm.seen.values()) == {1} and len(fcm.received) == 6
    assert len(apns.received) == 6 and set(apns.seen.values()) == {1}
    arrivals = sorted(r["at"] for r in apns.received)
    assert all(at - arrivals[0] >= (k - 1) / rate - 0.25 for k, at in enumerate(arrivals)), arrivals
    # the FCM devices were not held back by the APNs limit: each accepted on its push's first try
    firsts = DeliveryAttempt.objects.filter(notification_id__in=sent, number=1)
    assert set(firsts.values_list("provider_id", flat=True)) == {android}
    assert NotificationDevice.objects.filter(notification_id__in=sent, kind="fcm", status="delivered").count() == 6
