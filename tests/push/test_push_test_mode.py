"""A test key's push to a subscriber's native devices, with a real dispatcher process: the simulator
answers for each device (a token containing `permanent` fails so), the APNs, FCM and Web Push stand-ins
receive nothing, and the devices stay active."""

from __future__ import annotations

import pytest
from django.db import connection

from core.models import ApiKey
from recipients.models import Device
from tests.conftest import client_for
from tests.push.test_push_end_to_end import IOS, detail, drain, notify, providers, register

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_test_keys_push_reaches_no_vendor(tenant_a, api_a, standins, push_env, tmp_path):
    apns, fcm, webpush = standins
    providers(api_a, standins)  # configuration is shared by both modes
    test_api = client_for(ApiKey.issue(tenant_a, name="test", test=True)[1])
    assert test_api.put("/api/v1/subscribers/jane", {}, format="json").status_code == 201
    assert test_api.put("/api/v1/subscribers/joe", {}, format="json").status_code == 201
    register(test_api, "jane", kind="apns", token=IOS)
    register(test_api, "jane", kind="fcm", token="fcm-token-fine")
    register(test_api, "jane", kind="webpush", subscription=webpush.subscribe("jane").as_json())
    register(test_api, "joe", kind="fcm", token="fcm-token-permanent-1")
    fine, refused = notify(test_api, "jane", "Shipped"), notify(test_api, "joe", "Shipped")
    drain(push_env, tmp_path / "run")

    jane, joe = detail(test_api, fine), detail(test_api, refused)
    assert jane["test"] is True and jane["status"] == "delivered", jane
    assert sorted(d["status"] for d in jane["devices"]) == ["delivered"] * 3
    assert joe["status"] == "failed" and [d["status"] for d in joe["devices"]] == ["failed"], joe
    assert api_a.get(f"/api/v1/notifications/{fine}").status_code == 404
    assert apns.accepted(IOS) == [] and fcm.accepted("fcm-token-fine") == [] and webpush.accepted("jane") == []
    assert apns.refused == fcm.refused == webpush.refused == []
    assert fcm.grants == 0  # not even the OAuth grant: no provider instance was asked
    assert Device.objects.filter(active=False).count() == 0
    # the simulator's answers count on no provider's breaker or /metrics counter
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM delivery_counters WHERE provider_id <> 0 AND le = -1")
        assert cursor.fetchone()[0] == 0
        cursor.execute("SELECT count(*) FROM provider_circuits")
        assert cursor.fetchone()[0] == 0
