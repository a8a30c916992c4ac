"""Notifications by subscriber with a real dispatcher process: each reaches the subscriber's address for
its channel at a real SMTP server, the Twilio stand-in and the webhook receiver; an opt-out of a category
on email stops that category's email (no SMTP request, no attempt) but not its SMS; a critical category
still goes; a suppressed address does not, critical or not."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from notifications.models import DeliveryAttempt, Notification
from queueing.models import QueueItem
from recipients import suppressions
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver, SmtpSink

EMAIL = "jane.canary@example.org"
PHONE = "+15557654321"
TOKEN = "tok_push_a81f20c3"
SID = "AC" + "0123456789abcdef" * 2


@pytest.mark.django_db(transaction=True)
def test_by_subscriber_with_opt_outs_critical_categories_and_suppressions(tenant_a, api_a, subprocess_env, tmp_path):
    with (
        SmtpSink(max_seconds=60) as sink,
        HttpReceiver(status=201, body=b'{"sid": "SM01", "status": "queued"}', max_seconds=60) as twilio,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60) as hooks,
    ):
        factories.provider(tenant_a, "mail", kind="smtp", channel="email", is_default=True, secrets={},
                           config={"host": "127.0.0.1", "port": sink.port, "from_email": "noreply@omnipost.test"})
        factories.provider(tenant_a, "text", kind="twilio", channel="sms", is_default=True,
                           config={"account_sid": SID, "from_number": "+15005550006",
                                   "base_url": f"http://127.0.0.1:{twilio.port}/"},
                           secrets={"auth_token": "auth-token-0123456789abcdef"})
        factories.provider(tenant_a, "push", kind="webhook", channel="push", is_default=True,
                           config={"url": hooks.url}, secrets={"signing_secret": TEST_SIGNING_SECRET})  # fmt: skip
        assert api_a.post("/api/v1/categories", {"key": "news"}, format="json").status_code == 201
        assert api_a.post("/api/v1/categories", {"key": "security", "critical": True}, format="json").status_code == 201
        subscriber = {"email": EMAIL, "phone": PHONE, "push_tokens": [TOKEN],
                      "preferences": {"news": {"email": False}, "security": {"email": False}}}  # fmt: skip
        assert api_a.put("/api/v1/subscribers/user-42", subscriber, format="json").status_code == 201

        def send(channel: str, category: str, subject: str) -> dict:
            body = {"channel": channel, "subscriber": "user-42", "category": category, "subject": subject,
                    "body": f"{subject} body"}  # fmt: skip
            response = api_a.post("/api/v1/notifications", body, format="json")
            assert response.status_code == 201, response.content
            return response.json()

        sent = {
            "email-general": send("email", "general", "Hello"),
            "email-news": send("email", "news", "Weekly news"),
            "sms-news": send("sms", "news", "News by SMS"),
            "email-security": send("email", "security", "New login"),
            "push-general": send("push", "general", "Ping"),
        }
        assert sent["email-news"]["status"] == "suppressed"
        assert {k: v["status"] for k, v in sent.items() if k != "email-news"} == dict.fromkeys(
            ["email-general", "sms-news", "email-security", "push-general"], "queued"
        )
        drain(subprocess_env, tmp_path / "run1")
        assert sink.wait_for(2)

        # queued while no dispatcher runs; then the subscriber unsubscribes from `general` by email
        # (a category-scoped entry, as one-click unsubscribe writes): general stops, critical goes
        sent["email-general-2"] = send("email", "general", "Hello again")
        sent["email-security-2"] = send("email", "security", "Second login")
        suppressions.suppress(tenant_a.pk, "email", EMAIL, "unsubscribed", "general")
        drain(subprocess_env, tmp_path / "run2")
        assert sink.wait_for(3)

        # a complaint suppresses the address for every category: critical does not go either
        suppressions.suppress(tenant_a.pk, "email", EMAIL.upper(), "complaint")
        sent["email-security-3"] = send("email", "security", "Third login")
        assert sent["email-security-3"]["status"] == "suppressed"
        mails = sorted((m.message["Subject"], m.rcpt_tos) for m in sink.messages)
        twilio_forms = [parse_qs(r.body.decode()) for r in twilio.requests]
        pushes = [r.payload for r in hooks.requests]

    assert mails == [("Hello", [EMAIL]), ("New login", [EMAIL]), ("Second login", [EMAIL])]
    assert [(f["To"], f["Body"]) for f in twilio_forms] == [([PHONE], ["News by SMS body"])]
    assert [(p["recipient"], p["subject"]) for p in pushes] == [(TOKEN, "Ping")]
    assert all(r.verified for r in hooks.requests)
    statuses = {k: Notification.objects.get(pk=v["id"]).status for k, v in sent.items()}
    assert statuses == {"email-general": "delivered", "email-news": "suppressed", "sms-news": "delivered",
                        "email-security": "delivered", "push-general": "delivered", "email-general-2": "suppressed",
                        "email-security-2": "delivered", "email-security-3": "suppressed"}  # fmt: skip
    blocked = [sent[k]["id"] for k in ("email-news", "email-general-2", "email-security-3")]
    assert not DeliveryAttempt.objects.filter(notification_id__in=blocked).exists()


def drain(env: dict, log_dir) -> None:  # noqa: ANN001
    """Run a dispatcher until the queue is empty, then stop it."""
    log_dir.mkdir()
    procs = start_dispatchers(1, env, "--batch-size", "10", log_dir=log_dir)
    try:
        assert wait_started(log_dir, 1)
        assert wait_until(lambda: not QueueItem.objects.exists(), 30)
    finally:
        for proc in procs:
            proc.terminate()
        assert wait_exit(procs, 20) == [0]
