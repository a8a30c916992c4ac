"""OMNIPOST_LOG_FORMAT=json: one JSON object per line, delivery context on every delivery line, no
recipient in clear — checked on a real dispatcher process delivering to console and loopback providers."""

from __future__ import annotations

import json
import logging
import signal
import sys

import pytest

from core.logging import JsonFormatter, MaskingFilter
from notifications.models import Notification
from queueing import queue
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

EMAIL = "jane.doe@example.com"
PHONE = "+15551234567"
PUSH_TOKEN = "tok_1234567890abcdef9f2c"
HOOK_RECIPIENT = "ops.team@example.org"


def test_formatter_masks_and_carries_context():
    record = logging.LogRecord("omnipost.dispatcher", logging.WARNING, __file__, 1, "failed for %s: %s", (EMAIL, PHONE),
                               None)  # fmt: skip
    record.notification_id, record.tenant_id, record.attempt, record.outcome = "n-1", "t-1", 3, "permanent_error"
    record.error_code = f"bounced {EMAIL}"
    try:
        raise ValueError(f"no mailbox {EMAIL}")
    except ValueError:
        record.exc_info = sys.exc_info()
    MaskingFilter().filter(record)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "WARNING" and data["logger"] == "omnipost.dispatcher"
    assert (data["notification_id"], data["tenant_id"], data["attempt"], data["outcome"]) == ("n-1", "t-1", 3,
                                                                                            "permanent_error")
    assert data["ts"].endswith("+00:00")
    assert EMAIL not in line and PHONE not in line
    assert "j***@example.com" in data["message"] and "no mailbox j***@example.com" in data["exc"]


def _queued(tenant, provider, recipient: str) -> Notification:
    n = factories.notifications(tenant, provider, 1, recipient=recipient)[0]
    queue.enqueue([queue.NewItem(notification_id=n.pk, tenant_id=tenant.pk, provider_id=provider.pk)])
    return n


@pytest.mark.django_db(transaction=True)
def test_a_dispatcher_process_writes_json_lines(tenant_a, subprocess_env, tmp_path):
    with (
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60, responses=[503]) as flaky,  # then 200
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60, status=400) as refusing,
    ):
        secrets = {"signing_secret": TEST_SIGNING_SECRET}
        mail = factories.provider(tenant_a, "mail", kind="console", channel="email", config={})
        text = factories.provider(tenant_a, "text", kind="console", channel="sms", config={})
        hook = factories.provider(tenant_a, "hook", channel="push", config={"url": flaky.url}, secrets=secrets)
        bad = factories.provider(tenant_a, "bad", channel="webhook", config={"url": refusing.url}, secrets=secrets)
        notes = {
            "email": _queued(tenant_a, mail, EMAIL),
            "sms": _queued(tenant_a, text, PHONE),
            "push": _queued(tenant_a, hook, PUSH_TOKEN),
            "webhook": _queued(tenant_a, bad, HOOK_RECIPIENT),
        }
        env = {
            **subprocess_env, "OMNIPOST_LOG_FORMAT": "json", "OMNIPOST_LOG_LEVEL": "DEBUG",
            "OMNIPOST_RETRY_BASE_SECONDS": "0.05", "OMNIPOST_RETRY_MAX_SECONDS": "0.1",
        }  # fmt: skip
        procs = start_dispatchers(1, env, "--batch-size", "10", log_dir=tmp_path)
        try:
            assert wait_started(tmp_path, 1)

            def settled() -> bool:
                statuses = dict(Notification.objects.values_list("pk", "status"))
                return [statuses[n.pk] for n in notes.values()] == ["delivered", "delivered", "delivered", "failed"]

            assert wait_until(settled, 30), dict(Notification.objects.values_list("pk", "status"))
        finally:
            procs[0].send_signal(signal.SIGTERM)
            assert wait_exit(procs, 15) == [0]
        assert len(flaky.requests) == 2 and len(refusing.requests) == 1

    raw = (tmp_path / "dispatcher0.log").read_text()
    lines = [line for line in raw.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r["level"] == "DEBUG" for r in records), "OMNIPOST_LOG_LEVEL=DEBUG reached the process"

    # Every delivery line carries notification id, tenant id, attempt and outcome.
    delivery = [r for r in records if r["logger"] == "omnipost.dispatcher" and "notification_id" in r]
    for r in delivery:
        assert r["tenant_id"] == str(tenant_a.pk) and isinstance(r["attempt"], int) and r["outcome"], r
    outcomes = {(r["notification_id"], r["attempt"], r["outcome"]) for r in delivery}
    ids = {name: str(n.pk) for name, n in notes.items()}
    assert outcomes == {
        (ids["email"], 1, "delivered"),
        (ids["sms"], 1, "delivered"),
        (ids["push"], 1, "transient_error"),
        (ids["push"], 2, "delivered"),
        (ids["webhook"], 1, "permanent_error"),
    }
    # The console provider's own line: the masked message with the same context.
    console = {r["notification_id"]: r for r in records if r["logger"] == "omnipost.delivery"}
    assert set(console) == {ids["email"], ids["sms"]}
    assert console[ids["email"]]["attempt"] == 1 and console[ids["email"]]["tenant_id"] == str(tenant_a.pk)
    assert "j***@example.com" in console[ids["email"]]["message"]
    assert "+1******4567" in console[ids["sms"]]["message"]

    # No recipient and no secret anywhere in the output.
    for secret in (EMAIL, PHONE, PUSH_TOKEN, HOOK_RECIPIENT, TEST_SIGNING_SECRET):
        assert secret not in raw, secret
