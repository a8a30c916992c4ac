"""Real dispatcher processes deliver event webhooks to a real loopback receiver that verifies every
request with the `standardwebhooks` package: retries keep the webhook-id, an endpoint failing for
the configured time is disabled, re-enabling sends nothing, `recover` re-sends with the original ids."""

from __future__ import annotations

import base64
import signal
import time

import pytest
from django.utils import timezone

from events.models import Event, EventEndpoint
from notifications.models import Notification
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/event-endpoints"
EVENT_SECRET = "whsec_" + base64.b64encode(b"e" * 32).decode()


def hook_for(tenant, receiver):
    return factories.provider(tenant, config={"url": receiver.url}, secrets={"signing_secret": TEST_SIGNING_SECRET})


def fast_retries(env: dict, **extra: str) -> dict:
    return {**env, "OMNIPOST_RETRY_BASE_SECONDS": "0.05", "OMNIPOST_RETRY_MAX_SECONDS": "0.2", **extra}


def stop(procs) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    assert wait_exit(procs, 30) == [0] * len(procs)


def test_503_503_200_is_three_requests_with_one_webhook_id(tenant_a, api_a, webhook_receiver, subprocess_env,
                                                           tmp_path):
    with HttpReceiver(secret=EVENT_SECRET, max_seconds=60, responses=[503, 503], status=200) as events_rx:
        created = api_a.post(URL, {"name": "ops", "url": events_rx.url, "event_types": ["notification.delivered"],
                                   "secret": EVENT_SECRET}, format="json")  # fmt: skip
        assert created.status_code == 201, created.content
        (note,) = factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 1)
        procs = start_dispatchers(1, fast_retries(subprocess_env), log_dir=tmp_path)
        try:
            assert wait_started(tmp_path, 1)
            assert events_rx.wait_for(3, timeout=20), (tmp_path / "dispatcher0.log").read_text()[-3000:]
            time.sleep(0.3)  # nothing more comes after the 200
        finally:
            stop(procs)
        requests = events_rx.requests
        assert [r.status for r in requests] == [503, 503, 200]
        assert all(r.verified for r in requests)  # standardwebhooks.Webhook(secret).verify() in the receiver
        event = Event.objects.get()
        assert {r.webhook_id for r in requests} == {event.public_id}
        assert requests[-1].payload["data"]["notification_id"] == str(note.id)
        attempts = api_a.get(f"{URL}/ops/attempts").json()["results"]
        assert [(a["status"], a["http_status"], a["event_id"]) for a in attempts] == [
            ("delivered", 200, event.public_id), ("failed", 503, event.public_id), ("failed", 503, event.public_id)]


def test_disabled_after_failing_time_then_reenabled_without_resending_and_recovered(
    tenant_a, api_a, webhook_receiver, subprocess_env, tmp_path
):
    # 0.0003 h ≈ 1.1 s of unbroken failures disables the endpoint
    env = fast_retries(subprocess_env, OMNIPOST_EVENT_ENDPOINT_DISABLE_AFTER_HOURS="0.0003")
    with HttpReceiver(secret=EVENT_SECRET, max_seconds=90, status=503) as events_rx:
        api_a.post(URL, {"name": "ops", "url": events_rx.url, "event_types": ["*"], "secret": EVENT_SECRET},
                   format="json")  # fmt: skip
        start = timezone.now().isoformat()
        provider = hook_for(tenant_a, webhook_receiver)
        factories.queued(tenant_a, provider, 2)
        procs = start_dispatchers(1, env, log_dir=tmp_path)
        try:
            assert wait_started(tmp_path, 1)
            assert wait_until(lambda: not EventEndpoint.objects.get(name="ops").enabled, 20)
            detail = api_a.get(f"{URL}/ops").json()
            assert detail["enabled"] is False and "failing" in detail["disabled_reason"]
            first_ids = {r.webhook_id for r in events_rx.requests}
            assert len(first_ids) == 2
            time.sleep(0.3)
            seen = len(events_rx.requests)
            time.sleep(0.3)
            assert len(events_rx.requests) == seen  # not attempted while disabled
            # an event made while disabled is kept too (recover sends it)
            factories.queued(tenant_a, provider, 1)
            assert wait_until(lambda: Notification.objects.filter(status="delivered").count() == 3, 10)
            assert wait_until(lambda: Event.objects.count() == 3, 5)
            assert api_a.post(f"{URL}/ops/recover", {"since": start}, format="json").status_code == 409
            events_rx.configure(status=200)
            assert api_a.patch(f"{URL}/ops", {"enabled": True}, format="json").json()["enabled"] is True
            time.sleep(0.4)
            assert len(events_rx.requests) == seen  # re-enabled without re-sending
            response = api_a.post(f"{URL}/ops/recover", {"since": start}, format="json")
            assert response.status_code == 202 and response.json() == {"queued": 3}
            assert wait_until(lambda: sum(r.status == 200 for r in events_rx.requests) == 3, 15)
        finally:
            stop(procs)
        delivered = [r for r in events_rx.requests if r.status == 200]
        assert all(r.verified for r in events_rx.requests)
        assert {r.webhook_id for r in delivered} == {e.public_id for e in Event.objects.all()}
        assert first_ids <= {r.webhook_id for r in delivered}  # the original webhook-ids
