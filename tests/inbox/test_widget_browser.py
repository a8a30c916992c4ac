"""The inbox widget in a real browser: Debian's chromium driven through Playwright.

A page served from another origin (the tenant's app) embeds `/inbox/v1/widget.js` and
`<omnipost-inbox base-url token>`. A notification created through the API, delivered by a real
dispatcher, appears in the open widget without a reload; clicking it drops the unread count; the API
shows it read, and `notification.read` reaches the tenant's event endpoint. Screenshot in
test-artifacts/inbox-widget.png."""

from __future__ import annotations

import httpx
import pytest

from tests.dlq.test_console_browser import ARTIFACTS, chromium_page
from tests.inbox.support import PAGE, tenant_app
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started
from tests.support.receivers import HttpReceiver
from tests.support.web import granian

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

def test_the_widget_on_another_origin_shows_a_new_notification_live_and_reads_it(key_a, subprocess_env, tmp_path):
    env = {**subprocess_env, "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS": "true"}
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    with HttpReceiver(secret=SECRET, max_seconds=120) as events_rx, granian(env) as web:
        api = httpx.Client(base_url=f"{web.url}/api/v1/", headers={"Authorization": f"Bearer {key_a}"}, timeout=20)
        assert api.put("subscribers/jane", json={}).status_code == 201
        hook = api.post("event-endpoints", json={"name": "ops", "url": events_rx.url, "secret": SECRET,
                                                  "event_types": ["notification.read"]})  # fmt: skip
        assert hook.status_code == 201, hook.text
        token = api.post("subscribers/jane/inbox-token", json={"ttl_seconds": 600}).json()["token"]
        procs = start_dispatchers(1, env, "--batch-size", "10", log_dir=log_dir)
        try:
            assert wait_started(log_dir, 1)
            with tenant_app(PAGE.format(omnipost=web.url, token=token)) as app_origin:
                allowed = api.patch("settings", json={"inbox_allowed_origins": [app_origin]})
                assert allowed.status_code == 200, allowed.text
                with chromium_page(900, 640) as page:
                    errors: list[str] = []
                    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                    page.goto(app_origin)
                    widget = page.locator("omnipost-inbox")
                    bell = widget.locator(".bell")
                    bell.click()
                    # the feed is read once the stream is open (the widget waits for its first event)
                    widget.get_by_text("Nothing yet").wait_for()

                    made = api.post("notifications", json={"channel": "in_app", "subscriber": "jane",
                                                           "subject": "Your order shipped",
                                                           "body": "Order 42 is on its way"})  # fmt: skip
                    assert made.status_code == 201, made.text
                    notification_id = made.json()["id"]
                    item = widget.locator("li[data-id]", has_text="Your order shipped")
                    item.wait_for(timeout=60_000)  # delivered by the dispatcher, pushed by the stream
                    count = widget.locator(".count")
                    assert count.inner_text() == "1" and "unread" in (item.get_attribute("class") or "")
                    ARTIFACTS.mkdir(exist_ok=True)
                    page.screenshot(path=str(ARTIFACTS / "inbox-widget.png"))

                    item.click()
                    count.wait_for(state="hidden")
                    page.wait_for_function(
                        "() => document.querySelector('omnipost-inbox').shadowRoot"
                        ".querySelector('li[data-id]').className === 'read'")  # fmt: skip
                    page.screenshot(path=str(ARTIFACTS / "inbox-widget-read.png"))
                    assert not [e for e in errors if "omnipost" in e.lower() or "cors" in e.lower()], errors

            inbox = httpx.Client(base_url=f"{web.url}/inbox/v1/", headers={"Authorization": f"Bearer {token}"})
            (shown,) = inbox.get("feed").json()["results"]
            assert shown["notification_id"] == notification_id and shown["read_at"] and shown["seen_at"]
            assert inbox.get("counts").json() == {"unseen": 0, "unread": 0, "total": 1}
            events = [e["type"] for e in api.get(f"notifications/{notification_id}").json()["events"]]
            assert "read" in events
            assert events_rx.wait_for(1, timeout=60)
            (request,) = events_rx.requests
            assert request.verified is True
            assert request.payload["type"] == "notification.read"
            assert request.payload["data"]["notification_id"] == notification_id
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 20) == [0]
