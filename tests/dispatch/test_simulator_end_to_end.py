"""Test mode with a real dispatcher process: a test key's notification to each simulator address of
each channel ends in its outcome, with its receipt, events and (hard bounce, complaint) a suppression
that only test keys see; the providers' stand-ins (SMTP sink, Twilio stand-in, webhook receivers)
receive nothing; the event webhooks say `"test": true`; a live key lists none of it and reads none
of it (404), and a live notification to the same address still goes out."""

from __future__ import annotations

import pytest

from core.models import ApiKey
from dlq.models import DeadLetter
from inbox.models import InboxItem
from notifications.models import DeliveryAttempt, Notification
from queueing.models import QueueItem
from routing.models import ProviderCircuit
from tests import factories
from tests.conftest import client_for
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.receipts.event_support import add_endpoint
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver, SmtpSink

SID = "AC" + "0123456789abcdef" * 2
FINAL = {"delivered", "failed", "dead_lettered", "suppressed"}
# Breakers that one transient failure would open: the simulator's failures must not count (no provider was asked).
TRIP = {"min_requests": 1, "failure_threshold": 0.1}

# (channel, recipient) → (status, receipt, bounce type, attempts)
EXPECTED = {
    ("email", "delivered@simulator.test"): ("delivered", "delivered", None, 1),
    ("email", "bounce@example.com"): ("delivered", "bounced", "hard", 1),
    ("email", "softbounce@simulator.test"): ("delivered", "bounced", "soft", 1),
    ("email", "complaint@simulator.test"): ("delivered", "complained", None, 1),
    ("email", "transient@simulator.test"): ("dead_lettered", None, None, 2),
    ("email", "permanent@simulator.test"): ("failed", None, None, 1),
    ("email", "anyone@example.org"): ("delivered", "delivered", None, 1),
    ("sms", "+15005550006"): ("delivered", "delivered", None, 1),
    ("sms", "+15005550001"): ("failed", None, None, 1),
    ("sms", "+15005550009"): ("delivered", "undelivered", None, 1),
    ("sms", "+15005550004"): ("dead_lettered", None, None, 2),
    ("push", "tok_transient_1"): ("dead_lettered", None, None, 2),
    ("push", "tok_permanent_1"): ("failed", None, None, 1),
    ("push", "tok_fine_1"): ("delivered", None, None, 1),
}


@pytest.mark.django_db(transaction=True)
def test_simulator_outcomes_receipts_suppressions_and_separation(tenant_a, api_a, subprocess_env, tmp_path):
    test_api = client_for(ApiKey.issue(tenant_a, name="test", test=True)[1])
    env = {**subprocess_env, "OMNIPOST_RETRY_BASE_SECONDS": "0.2", "OMNIPOST_RETRY_MAX_SECONDS": "0.5"}
    with (
        SmtpSink(max_seconds=90) as sink,
        HttpReceiver(status=201, body=b'{"sid": "SM01", "status": "queued"}', max_seconds=90) as twilio,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=90) as pushes,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=90) as hooks,
        HttpReceiver(max_seconds=90) as events,
    ):
        factories.provider(
            tenant_a,
            "mail",
            kind="smtp",
            channel="email",
            is_default=True,
            secrets={},
            max_attempts=2,
            circuit=TRIP,
            config={"host": "127.0.0.1", "port": sink.port, "from_email": "noreply@omnipost.test"},
        )
        factories.provider(
            tenant_a,
            "text",
            kind="twilio",
            channel="sms",
            is_default=True,
            max_attempts=2,
            circuit=TRIP,
            config={"account_sid": SID, "from_number": "+15005550006", "base_url": f"http://127.0.0.1:{twilio.port}/"},
            secrets={"auth_token": "auth-token-0123456789abcdef"},
        )
        factories.provider(
            tenant_a,
            "push",
            kind="webhook",
            channel="push",
            is_default=True,
            max_attempts=2,
            circuit=TRIP,
            config={"url": pushes.url},
            secrets={"signing_secret": TEST_SIGNING_SECRET},
        )
        factories.provider(
            tenant_a,
            "hook",
            kind="webhook",
            channel="webhook",
            is_default=True,
            max_attempts=2,
            circuit=TRIP,
            config={"url": hooks.url},
            secrets={"signing_secret": TEST_SIGNING_SECRET},
        )
        endpoint = add_endpoint(api_a, events)  # configuration is shared: the test key's events go there too
        assert test_api.put("/api/v1/subscribers/user-1", {"email": "x@example.com"}, format="json").status_code == 201

        def send(api, channel: str, recipient: str | None = None, **extra) -> dict:  # noqa: ANN001, ANN003
            body = {"channel": channel, "subject": "Hi", "body": "Hello", **extra}
            if recipient is not None:
                body["recipient"] = recipient
            response = api.post("/api/v1/notifications", body, format="json")
            assert response.status_code == 201, response.content
            return response.json()

        sent = {key: send(test_api, *key) for key in EXPECTED}
        assert all(n["test"] is True for n in sent.values())
        # webhook URLs: the recipient of a webhook notification is its URL
        sent[("webhook", "https://hooks.example.test/permanent")] = send(
            test_api, "webhook", "https://hooks.example.test/permanent")  # fmt: skip
        sent[("webhook", "https://hooks.example.test/ok")] = send(test_api, "webhook", "https://hooks.example.test/ok")
        inbox = send(test_api, "in_app", subscriber="user-1")
        ids = [n["id"] for n in sent.values()] + [inbox["id"]]

        log_dir = tmp_path / "dispatch"
        log_dir.mkdir()
        procs = start_dispatchers(1, env, "--batch-size", "10", log_dir=log_dir)
        try:
            assert wait_started(log_dir, 1)
            done = lambda: set(Notification.objects.filter(pk__in=ids).values_list("status", flat=True)) <= FINAL  # noqa: E731
            assert wait_until(done, 60), (log_dir / "dispatcher0.log").read_text()[-3000:]
            assert wait_until(lambda: not QueueItem.objects.exists(), 30)
            # receipts come through the receipt service; the event lane delivers the events
            receipted = [n["id"] for k, n in sent.items() if k in EXPECTED and EXPECTED[k][1]]
            assert wait_until(lambda: Notification.objects.filter(pk__in=receipted, receipt__isnull=False).count()
                              == len(receipted), 30)  # fmt: skip
            assert wait_until(lambda: len(endpoint.of_type("notification.bounced")) == 2, 30)
            assert wait_until(lambda: len(endpoint.of_type("notification.complained")) == 1, 30)
            # the same address live: really sent (the test data's suppression does not block it)
            live = send(api_a, "email", "bounce@example.com")
            assert live["status"] == "queued" and live["test"] is False
            assert wait_until(lambda: Notification.objects.get(pk=live["id"]).status == "delivered", 30)
            assert sink.wait_for(1)
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 20) == [0]
        mails = [m.rcpt_tos for m in sink.messages]
        twilio_requests, push_requests, hook_requests = len(twilio.requests), len(pushes.requests), len(hooks.requests)
        payloads = endpoint.events()

    assert not ProviderCircuit.objects.exclude(state="closed").exists()
    # the stand-ins got nothing of the test data: only the one live email reached the SMTP sink
    assert mails == [["bounce@example.com"]]
    assert (twilio_requests, push_requests, hook_requests) == (0, 0, 0)

    for key, (status, receipt, bounce_type, attempts) in EXPECTED.items():
        detail = test_api.get(f"/api/v1/notifications/{sent[key]['id']}").json()
        assert (detail["status"], detail["receipt"], detail["bounce_type"], len(detail["attempts"])) == (
            status, receipt, bounce_type, attempts), key  # fmt: skip
        assert detail["test"] is True
        if receipt is not None:
            assert [e["type"] for e in detail["events"]] == [receipt], key
        # a live key reads none of it
        assert api_a.get(f"/api/v1/notifications/{sent[key]['id']}").status_code == 404
    webhook_statuses = [test_api.get(f"/api/v1/notifications/{sent[('webhook', u)]['id']}").json()["status"]
                        for u in ("https://hooks.example.test/permanent", "https://hooks.example.test/ok")]  # fmt: skip
    assert webhook_statuses == ["failed", "delivered"]

    # in-app: simulated delivered, no feed item
    assert Notification.objects.get(pk=inbox["id"]).status == "delivered"
    assert not InboxItem.objects.filter(notification_id=inbox["id"]).exists()

    # suppressions: the hard bounce and the complaint, test data only
    test_entries = test_api.get("/api/v1/suppressions").json()["results"]
    assert sorted((e["reason"], e["source_notification_id"]) for e in test_entries) == sorted([
        ("hard_bounce", sent[("email", "bounce@example.com")]["id"]),
        ("complaint", sent[("email", "complaint@simulator.test")]["id"]),
    ])  # fmt: skip
    assert api_a.get("/api/v1/suppressions").json()["results"] == []
    assert api_a.get("/api/v1/suppressions", {"recipient": "bounce@example.com"}).json()["results"] == []
    assert api_a.get(f"/api/v1/suppressions/{test_entries[0]['id']}").status_code == 404
    # … and a test notification to the suppressed address is suppressed at creation
    assert send_status(test_api, "bounce@example.com") == "suppressed"

    # dead letters (3 transient, 4 permanent failures): test data
    dead = DeadLetter.objects.filter(notification_id__in=ids)
    assert sorted(d.failure_class for d in dead) == ["permanent"] * 4 + ["transient"] * 3
    assert all(d.test for d in dead)
    assert api_a.get("/api/v1/dlq").json()["results"] == []
    assert len(test_api.get("/api/v1/dlq").json()["results"]) == 7

    # listing: each key sees its own mode only
    live_ids = {n["id"] for n in api_a.get("/api/v1/notifications", {"limit": 100}).json()["results"]}
    test_ids = {n["id"] for n in test_api.get("/api/v1/notifications", {"limit": 100}).json()["results"]}
    assert live_ids == {live["id"]}
    assert set(ids) <= test_ids and live["id"] not in test_ids
    assert test_api.get(f"/api/v1/notifications/{live['id']}").status_code == 404

    # event webhooks: every notification event of the test data says so in its data, the live one not
    test_events = [e for e in payloads if e["data"].get("notification_id") in set(ids)]
    assert test_events and all(e["data"]["test"] is True for e in test_events)
    assert {e["type"] for e in test_events} >= {"notification.delivered", "notification.failed",
                                                "notification.dead_lettered", "notification.bounced",
                                                "notification.complained"}  # fmt: skip
    suppressed = [e for e in payloads if e["type"] == "recipient.suppressed"]
    assert len(suppressed) == 2 and all(e["data"]["test"] is True for e in suppressed)
    live_events = [e for e in payloads if e["data"].get("notification_id") == live["id"]]
    assert all("test" not in e["data"] for e in live_events)
    assert not DeliveryAttempt.objects.filter(notification_id=inbox["id"], outcome="permanent_error").exists()


def send_status(api, recipient: str) -> str:  # noqa: ANN001
    response = api.post("/api/v1/notifications", {"channel": "email", "recipient": recipient, "subject": "s",
                                                 "body": "b"}, format="json")  # fmt: skip
    assert response.status_code == 201, response.content
    return response.json()["status"]
