"""The webhook kind end to end over real HTTP: the API (a gunicorn process) creates a notification,
a dispatcher process sends it to a loopback receiver, and the receiver's signed event, posted back to
the provider's events_url, shows up as the notification's receipt and events, and as events at the
tenant's event endpoint (verified with `standardwebhooks`); a webhook address is never suppressed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from core.models import ApiKey
from events.models import Event
from notifications.models import Notification
from receipts.models import NotificationEvent
from tests import factories
from tests.receipts.conftest import signed
from tests.receipts.event_support import add_endpoint, deliver_events, suppressions
from tests.support import web
from tests.support.fixtures import signing_secret, webhook_receiver  # noqa: F401
from tests.support.receivers import TEST_SIGNING_SECRET

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

@pytest.fixture
def server(subprocess_env: dict[str, str]) -> Iterator[str]:
    with web.gunicorn(subprocess_env) as served:
        yield served.url


def test_webhook_receipts_end_to_end(  # noqa: PLR0913
    server, webhook_receiver, event_receiver, tenant_a, tenant_b, subprocess_env, tmp_path  # noqa: F811
):
    hook = factories.provider(tenant_a, "hook", config={"url": webhook_receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, is_default=True)  # fmt: skip
    other = factories.provider(tenant_b, "hook", config={"url": webhook_receiver.url},
                               secrets={"signing_secret": "whsec_" + "Yg" * 22})  # fmt: skip
    theirs = factories.notifications(tenant_b, other, 1, status="delivered")[0]
    api = httpx.Client(base_url=f"{server}/api/v1", headers={"Authorization": f"Bearer {ApiKey.issue(tenant_a)[1]}"})

    # The provider tells where its events go.
    shown = api.get("/providers/hook").json()
    assert shown["id"] == hook.pk and shown["events_url"] == f"{server}/hooks/providers/{hook.pk}"
    events_url = shown["events_url"]
    endpoint = add_endpoint(api, event_receiver)  # the tenant's own system, subscribed to every type

    # A real send, by a dispatcher process; its outcome reaches the tenant's endpoint.
    created = api.post("/notifications", json={"channel": "webhook", "recipient": "cust_8Kq2", "body": "hi"})
    assert created.status_code == 201, created.text
    note_id = created.json()["id"]
    assert created.json()["receipt"] is None and created.json()["bounce_type"] is None
    deliver_events(subprocess_env, tmp_path)
    assert webhook_receiver.wait_for(1)
    sent = webhook_receiver.requests[0]
    assert sent.verified and sent.headers["webhook-id"] == note_id
    [accepted] = endpoint.events()
    assert accepted["type"] == "notification.delivered"
    assert accepted["data"] == {
        "notification_id": note_id, "status": "delivered", "receipt": None, "bounce_type": None, "channel": "webhook",
        "recipient_masked": created.json()["recipient_masked"], "provider": "hook", "attempt_count": 1,
        "error_code": None}  # fmt: skip

    # The receiver posts back: a hard bounce, signed with the provider's secret (standardwebhooks).
    bounce = {"type": "bounced", "notification_id": sent.headers["webhook-id"],
              "occurred_at": "2026-05-01T12:00:05+00:00", "details": {"bounce_type": "hard", "smtp": "5.1.1"}}
    body, headers = signed(TEST_SIGNING_SECRET, bounce, msg_id="evt_1")
    answer = httpx.post(events_url, content=body, headers={**headers, "Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json() == {"received": 1}
    detail = api.get(f"/notifications/{note_id}").json()
    assert (detail["status"], detail["receipt"], detail["bounce_type"]) == ("delivered", "bounced", "hard")
    assert detail["events"] == [{"type": "bounced", "occurred_at": "2026-05-01T12:00:05Z", "provider": "hook",
                                 "details": {"bounce_type": "hard", "smtp": "5.1.1"}}]  # fmt: skip

    # The same event again: one event. A later `delivered` (reported as earlier): still bounced.
    assert httpx.post(events_url, content=body, headers=headers).status_code == 200
    delivered = {"type": "delivered", "notification_id": note_id, "occurred_at": "2026-05-01T12:00:01Z"}
    body2, headers2 = signed(TEST_SIGNING_SECRET, delivered, msg_id="evt_2")
    assert httpx.post(events_url, content=body2, headers=headers2).status_code == 200
    detail = api.get(f"/notifications/{note_id}").json()
    assert detail["receipt"] == "bounced"
    assert [e["type"] for e in detail["events"]] == ["delivered", "bounced"]  # by occurred_at, oldest first
    assert [n["id"] for n in api.get("/notifications", params={"receipt": "bounced"}).json()["results"]] == [note_id]
    assert api.get("/notifications", params={"receipt": "delivered"}).json()["results"] == []
    assert api.get("/notifications", params={"receipt": "opened"}).status_code == 400

    # What does not verify: 401, nothing changed.
    before = NotificationEvent.objects.count()
    complaint = {"type": "complained", "notification_id": note_id}
    cases = {
        "bad signature": (*signed("whsec_" + "QQ" * 22, complaint), events_url),
        "stale": (*signed(TEST_SIGNING_SECRET, complaint, timestamp=datetime.now(UTC) - timedelta(minutes=6)),
                  events_url),
        "another provider's URL": (*signed(TEST_SIGNING_SECRET, complaint), f"{server}/hooks/providers/{other.pk}"),
    }  # fmt: skip
    for case, (b, h, url) in cases.items():
        response = httpx.post(url, content=b, headers=h)
        assert response.status_code == 401, (case, response.text)
    assert NotificationEvent.objects.count() == before
    assert Notification.objects.get(pk=note_id).receipt == "bounced"

    body4, headers4 = signed(TEST_SIGNING_SECRET, {"type": "delivered", "notification_id": str(uuid.uuid4())})
    # Another tenant's notification, validly signed: 200, unchanged, counted in /metrics.
    body3, headers3 = signed(TEST_SIGNING_SECRET, {"type": "complained", "notification_id": str(theirs.pk)})
    assert httpx.post(events_url, content=body3, headers=headers3).json() == {"received": 1}
    theirs.refresh_from_db()
    assert theirs.receipt is None and not NotificationEvent.objects.filter(notification=theirs).exists()
    metrics = httpx.get(f"{server}/metrics").text
    assert f'omnipost_receipts_ignored_total{{provider="hook",provider_id="{hook.pk}",reason="foreign"}} 1.0' in metrics
    # Served by receipts.wsgi's fast path as by the Django view: no endpoint 404, a big body 413.
    assert httpx.post(f"{server}/hooks/providers/999999", content=body4, headers=headers4).status_code == 404
    big = httpx.post(events_url, content=b"x" * (1024 * 1024 + 1), headers=headers4)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    assert httpx.get(events_url).status_code == 405
    # And an unknown id.
    assert httpx.post(events_url, content=body4, headers=headers4).status_code == 200
    metrics = httpx.get(f"{server}/metrics").text
    assert f'omnipost_receipts_ignored_total{{provider="hook",provider_id="{hook.pk}",reason="unknown"}} 1.0' in metrics

    # The tenant's endpoint, served by one more dispatcher process: the bounce once (its retry and the
    # late `delivered` make no event), nothing for what did not verify or was not this tenant's.
    deliver_events(subprocess_env, tmp_path)
    events = endpoint.events()
    assert [e["type"] for e in events] == ["notification.delivered", "notification.bounced"]
    bounced = events[1]
    assert bounced["webhook_id"] == Event.objects.get(type="notification.bounced").public_id
    assert {k: bounced["data"][k] for k in ("notification_id", "status", "receipt", "bounce_type", "channel")} == {
        "notification_id": note_id, "status": "delivered", "receipt": "bounced", "bounce_type": "hard",
        "channel": "webhook"}  # fmt: skip
    assert bounced["data"]["recipient_masked"] == detail["recipient_masked"] != "cust_8Kq2"
    assert "cust_8Kq2" not in endpoint.bodies()
    # A webhook address is no email or phone: a hard bounce suppresses nothing, and says nothing of it.
    assert suppressions(api, "cust_8Kq2") == []
    assert not Event.objects.filter(type="recipient.suppressed").exists()
