"""End to end with real processes: a gunicorn web server and a dispatcher. An in_app notification
created through the API is delivered into the subscriber's feed, read by the subscriber's browser token
on /inbox/v1/ (with the tenant's origin granted CORS), and the `notification.read` event reaches the
tenant's event endpoint (a loopback receiver checking its Standard Webhooks signature)."""

from __future__ import annotations

import httpx
import pytest

from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import HttpReceiver
from tests.support.web import gunicorn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
APP = "https://app.example.com"


def test_an_in_app_notification_is_delivered_read_and_reported(key_a, subprocess_env, tmp_path):
    env = {**subprocess_env, "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS": "true"}
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    with HttpReceiver(secret=SECRET, max_seconds=90) as events_rx, gunicorn(env) as web:
        api = httpx.Client(base_url=f"{web.url}/api/v1/", headers={"Authorization": f"Bearer {key_a}"}, timeout=10)
        assert api.put("subscribers/jane", json={}).status_code == 201
        hook = api.post("event-endpoints", json={"name": "ops", "url": events_rx.url, "secret": SECRET,
                                                  "event_types": ["notification.read"]})  # fmt: skip
        assert hook.status_code == 201, hook.text
        assert api.patch("settings", json={"inbox_allowed_origins": [APP]}).status_code == 200
        made = api.post("notifications", json={"channel": "in_app", "subscriber": "jane", "subject": "Shipped",
                                               "body": "Your order is on its way", "data": {"order": "42"},
                                               "action_url": "/orders/42"})  # fmt: skip
        assert made.status_code == 201, made.text
        notification_id = made.json()["id"]
        token = api.post("subscribers/jane/inbox-token", json={"ttl_seconds": 600}).json()["token"]
        inbox = httpx.Client(base_url=f"{web.url}/inbox/v1/", timeout=10,
                             headers={"Authorization": f"Bearer {token}", "Origin": APP})  # fmt: skip

        procs = start_dispatchers(1, env, "--batch-size", "10", log_dir=log_dir)
        try:
            assert wait_started(log_dir, 1)
            assert wait_until(lambda: inbox.get("counts").json()["unread"] == 1, 30)
            assert api.get(f"notifications/{notification_id}").json()["status"] == "delivered"
            feed = inbox.get("feed")
            assert feed.headers["access-control-allow-origin"] == APP
            (item,) = feed.json()["results"]
            assert (item["notification_id"], item["title"], item["body"], item["data"], item["action_url"]) == (
                notification_id, "Shipped", "Your order is on its way", {"order": "42"}, "/orders/42")  # fmt: skip
            read = inbox.post(f"feed/{item['id']}/read")
            assert read.status_code == 200 and read.json()["read_at"] and read.json()["seen_at"]
            assert inbox.get("counts").json() == {"unseen": 0, "unread": 0, "total": 1}

            assert events_rx.wait_for(1, timeout=30)
            (request,) = events_rx.requests
            assert request.verified is True
            payload = request.payload
            assert payload["type"] == "notification.read"
            assert payload["data"]["notification_id"] == notification_id
            assert payload["data"]["channel"] == "in_app" and payload["data"]["status"] == "delivered"
            assert [e["type"] for e in api.get(f"notifications/{notification_id}").json()["events"]] == [
                "seen", "read"]  # fmt: skip
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 20) == [0]
