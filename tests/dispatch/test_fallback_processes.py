"""Channel fallback with real processes: a dispatcher process sends pushes to
loopback receivers and SMS to the Twilio stand-in, a scheduler process promotes the fallbacks' jobs,
receipts arrive at the provider's events URL signed per Standard Webhooks.

- a push that fails permanently (400), or transiently with no attempt left (dead-lettered) → its SMS
  fallback goes at once, to the subscriber's phone;
- a push accepted, then a `delivered` receipt before `after_seconds` → no SMS (the fallback cancelled),
  while a push accepted with no receipt gets its SMS after `after_seconds` (so the scheduler did pass
  the cancelled one's time);
- a push accepted, then a `failed` receipt → its SMS at once, however far `after_seconds` is;
- `after_seconds` counts from the provider's acceptance: the job's run_at is delivered_at + after_seconds.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

import pytest
from django.db.models.functions import Now
from django.test import Client

from notifications.models import DeliveryAttempt, Notification
from queueing.models import ScheduledJob
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.queueing.scheduler_support import start_scheduler, wait_for_text
from tests.receipts.conftest import signed
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

PHONE = "+15557654321"
TOKEN = "tok_push_fallback_5f1e"
SID = "AC" + "0123456789abcdef" * 2


def post_receipt(provider_id: int, notification_id: str, type_: str) -> int:
    event = {"type": type_, "notification_id": notification_id, "occurred_at": datetime.now(UTC).isoformat(),
             "details": {}}  # fmt: skip
    body, headers = signed(TEST_SIGNING_SECRET, event)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return Client().post(f"/hooks/providers/{provider_id}", body, content_type="application/json", **extra).status_code


def test_fallback_to_sms_on_failure_on_silence_and_not_after_a_delivered_receipt(
    tenant_a, api_a, subprocess_env, tmp_path
):
    with (
        HttpReceiver(status=201, body=b'{"sid": "SM01", "status": "queued"}', max_seconds=150) as twilio,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=150) as ok_hooks,
        HttpReceiver(status=400, secret=TEST_SIGNING_SECRET, max_seconds=150) as bad_hooks,
        HttpReceiver(status=503, secret=TEST_SIGNING_SECRET, max_seconds=150) as down_hooks,
    ):
        factories.provider(tenant_a, "text", kind="twilio", channel="sms", is_default=True,
                           config={"account_sid": SID, "from_number": "+15005550006",
                                   "base_url": f"http://127.0.0.1:{twilio.port}/"},
                           secrets={"auth_token": "auth-token-0123456789abcdef"})
        ok = factories.provider(tenant_a, "push-ok", kind="webhook", channel="push", is_default=True,
                                config={"url": ok_hooks.url}, secrets={"signing_secret": TEST_SIGNING_SECRET})
        factories.provider(tenant_a, "push-bad", kind="webhook", channel="push",
                           config={"url": bad_hooks.url}, secrets={"signing_secret": TEST_SIGNING_SECRET})
        factories.provider(tenant_a, "push-down", kind="webhook", channel="push", max_attempts=1,
                           config={"url": down_hooks.url}, secrets={"signing_secret": TEST_SIGNING_SECRET})  # fmt: skip
        subscriber = {"phone": PHONE, "push_tokens": [TOKEN]}
        assert api_a.put("/api/v1/subscribers/user-7", subscriber, format="json").status_code == 201

        def send(name: str, provider: str, after: int) -> tuple[str, str]:
            body = {"channel": "push", "subscriber": "user-7", "provider": provider, "subject": name,
                    "body": f"{name} body", "fallback": [{"channel": "sms", "after_seconds": after}]}  # fmt: skip
            response = api_a.post("/api/v1/notifications", body, format="json")
            assert response.status_code == 201, response.content
            return response.json()["id"], response.json()["fallback_notification_id"]

        sent = {
            "refused": send("refused", "push-bad", 300),  # permanent failure: SMS at once
            "exhausted": send("exhausted", "push-down", 300),  # 503 with one attempt allowed: dead-lettered
            "confirmed": send("confirmed", "push-ok", 1),  # a delivered receipt before 1 s is up: no SMS
            "silent": send("silent", "push-ok", 1),  # no receipt: SMS after 1 s
            "reported": send("reported", "push-ok", 3600),  # a `failed` receipt: SMS at once
        }
        fallbacks = {name: fb for name, (_, fb) in sent.items()}
        assert set(Notification.objects.filter(pk__in=fallbacks.values()).values_list("status", flat=True)) == {
            "scheduled"
        }

        log_dir = tmp_path / "logs"
        log_dir.mkdir()
        dispatcher = start_dispatchers(1, subprocess_env, "--batch-size", "10", log_dir=log_dir)
        scheduler = None
        try:
            assert wait_started(log_dir, 1)
            originals = [original for original, _ in sent.values()]
            assert wait_until(
                lambda: Notification.objects.filter(
                    pk__in=originals, status__in=["delivered", "failed", "dead_lettered"]
                ).count() == 5,
                60,
            )
            # the scheduler is not running yet: whatever the test's own pace, nothing is promoted before
            # the receipts below are in (they are "before after_seconds" in that sense)
            notes = {name: Notification.objects.get(pk=original) for name, (original, _) in sent.items()}
            assert {name: n.status for name, n in notes.items()} == {
                "refused": "failed", "exhausted": "dead_lettered", "confirmed": "delivered", "silent": "delivered",
                "reported": "delivered"}
            found = ScheduledJob.objects.filter(notification_id__in=fallbacks.values())
            jobs = {job.notification_id: job for job in found}
            job_of = {name: jobs[uuid.UUID(fb)] for name, fb in fallbacks.items()}
            assert {name: job.status for name, job in job_of.items()} == dict.fromkeys(sent, "pending")
            # after_seconds counts from the provider's acceptance (the same statement's clock)
            for name, after in (("confirmed", 1), ("silent", 1), ("reported", 3600)):
                assert job_of[name].run_at == notes[name].delivered_at + timedelta(seconds=after), name
            assert job_of["refused"].run_at == notes["refused"].updated_at  # failed: due at once
            assert job_of["exhausted"].run_at == notes["exhausted"].updated_at  # dead-lettered: likewise
            silent_fallback = Notification.objects.get(pk=fallbacks["silent"])
            assert silent_fallback.scheduled_for == job_of["silent"].run_at  # shown as its due time

            assert post_receipt(ok.pk, sent["confirmed"][0], "delivered") == 200
            assert post_receipt(ok.pk, sent["reported"][0], "failed") == 200
            assert Notification.objects.get(pk=fallbacks["confirmed"]).status == "cancelled"
            assert ScheduledJob.objects.get(notification_id=fallbacks["confirmed"]).status == "cancelled"
            reported_job = ScheduledJob.objects.get(notification_id=fallbacks["reported"])
            assert reported_job.status == "pending"
            assert ScheduledJob.objects.filter(pk=reported_job.pk, run_at__lte=Now()).exists()  # moved up to now

            scheduler = start_scheduler(subprocess_env, tmp_path / "scheduler.log", "--interval", "0.5")
            wait_for_text(tmp_path / "scheduler.log", "scheduler ready", scheduler)
            due = [fallbacks[name] for name in ("refused", "exhausted", "silent", "reported")]
            assert wait_until(
                lambda: Notification.objects.filter(pk__in=due, status="delivered").count() == 4, 60
            ), list(Notification.objects.filter(pk__in=due).values_list("status", flat=True))
            assert twilio.wait_for(4)
        finally:
            for proc in [*dispatcher, *([scheduler] if scheduler else [])]:
                proc.terminate()
            assert wait_exit([*dispatcher, *([scheduler] if scheduler else [])], 20) == [0] * (
                len(dispatcher) + (1 if scheduler else 0)
            )
        forms = [parse_qs(r.body.decode()) for r in twilio.requests]
        pushes_ok = sorted(r.payload["subject"] for r in ok_hooks.requests)
        pushes_bad = [r.payload["subject"] for r in bad_hooks.requests]
        pushes_down = [r.payload["subject"] for r in down_hooks.requests]

    assert sorted((f["To"], f["Body"]) for f in forms) == [
        ([PHONE], ["exhausted body"]), ([PHONE], ["refused body"]), ([PHONE], ["reported body"]),
        ([PHONE], ["silent body"])]  # fmt: skip
    assert pushes_ok == ["confirmed", "reported", "silent"] and pushes_bad == ["refused"]
    assert pushes_down == ["exhausted"]
    assert Notification.objects.get(pk=fallbacks["confirmed"]).status == "cancelled"
    assert not DeliveryAttempt.objects.filter(notification_id=fallbacks["confirmed"]).exists()
    for name in ("refused", "exhausted", "silent", "reported"):
        linked = Notification.objects.get(pk=fallbacks[name])
        assert (linked.channel, linked.fallback_of, linked.recipient) == ("sms", uuid.UUID(sent[name][0]), PHONE)
        assert list(DeliveryAttempt.objects.filter(notification_id=linked.pk).values_list("outcome", flat=True)) == [
            "delivered"]


def test_a_late_delivered_receipt_cancels_a_fallback_already_promoted_and_waiting_to_retry(
    tenant_a, api_a, subprocess_env, tmp_path
):
    """No receipt within `after_seconds`: the scheduler promotes the SMS fallback and the dispatcher
    tries it; the SMS provider answers 503 with Retry-After, so it waits in the queue, held by no
    one. Then the push's `delivered` receipt arrives, late: the fallback is cancelled and leaves
    the queue, and nothing sends it again."""
    from queueing.models import QueueItem

    with (
        HttpReceiver(status=503, headers={"Retry-After": "60"}, body=b'{"code": 20503, "message": "unavailable"}',
                     max_seconds=120) as twilio,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120) as hooks,
    ):
        factories.provider(tenant_a, "text", kind="twilio", channel="sms", is_default=True,
                           config={"account_sid": SID, "from_number": "+15005550006",
                                   "base_url": f"http://127.0.0.1:{twilio.port}/"},
                           secrets={"auth_token": "auth-token-0123456789abcdef"})
        push = factories.provider(tenant_a, "push", kind="webhook", channel="push", is_default=True,
                                  config={"url": hooks.url},
                                  secrets={"signing_secret": TEST_SIGNING_SECRET})  # fmt: skip
        subscriber = {"phone": PHONE, "push_tokens": [TOKEN]}
        assert api_a.put("/api/v1/subscribers/user-8", subscriber, format="json").status_code == 201
        body = {"channel": "push", "subscriber": "user-8", "subject": "late", "body": "late body",
                "fallback": [{"channel": "sms", "after_seconds": 1}]}  # fmt: skip
        created = api_a.post("/api/v1/notifications", body, format="json").json()
        original, linked = created["id"], created["fallback_notification_id"]

        log_dir = tmp_path / "logs"
        log_dir.mkdir()
        processes = start_dispatchers(1, subprocess_env, "--batch-size", "10", log_dir=log_dir)
        try:
            assert wait_started(log_dir, 1)
            processes.append(start_scheduler(subprocess_env, tmp_path / "scheduler.log", "--interval", "0.5"))
            wait_for_text(tmp_path / "scheduler.log", "scheduler ready", processes[-1])
            assert wait_until(lambda: Notification.objects.get(pk=linked).status == "retrying", 30)
            item = QueueItem.objects.get(notification_id=linked)
            assert item.lock_token is None and item.attempts == 1, "tried once, back in the queue, held by no one"
            assert len(twilio.requests) == 1
            assert Notification.objects.get(pk=original).status == "delivered"

            assert post_receipt(push.pk, original, "delivered") == 200

            assert Notification.objects.get(pk=linked).status == "cancelled"
            assert not QueueItem.objects.filter(notification_id=linked).exists()
            assert Notification.objects.get(pk=original).receipt == "delivered"
            rung = len(twilio.requests)
        finally:
            for proc in processes:
                proc.terminate()
            assert wait_exit(processes, 20) == [0] * len(processes)
    assert rung == len(twilio.requests) == 1, "the cancelled fallback was not sent again"
    tries = DeliveryAttempt.objects.filter(notification_id=linked).values_list("outcome", "http_status")
    assert list(tries) == [("transient_error", 503)]
    assert len(hooks.requests) == 1 and Notification.objects.get(pk=linked).status == "cancelled"
