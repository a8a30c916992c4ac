"""The soak's chaos receiver answers in the mode it is switched to: 200 (recorded), 503 and 429 with
Retry-After, a hang that never counts as accepted, and a port that stops listening and comes back."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import httpx
import pytest
from standardwebhooks import Webhook

from benchmarks.chaos_receiver import ChaosReceiver
from tests.support.receivers import TEST_SIGNING_SECRET

EVENTS_SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="


def post(url: str, msg_id: str, body: bytes, secret: str = TEST_SIGNING_SECRET, timeout: float = 5) -> httpx.Response:
    now = time.time()
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(now, tz=UTC), body.decode())
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(int(now)), "webhook-signature": signature}
    return httpx.post(url, content=body, headers=headers, timeout=timeout)


@pytest.fixture
def receiver(tmp_path):
    rx = ChaosReceiver(tmp_path / "log", provider_secret=TEST_SIGNING_SECRET, events_secret=EVENTS_SECRET,
                       verify_every=1)  # fmt: skip
    try:
        yield rx
    finally:
        if rx.proc.poll() is None:
            rx.stop()


def test_modes_change_the_answers_and_only_2xx_answers_count_as_accepted(receiver):
    assert post(receiver.provider_url, "n-1", b"{}").status_code == 200
    event = json.dumps({"type": "notification.delivered", "data": {"notification_id": "n-1"}}).encode()
    assert post(receiver.events_url, "evt_1", event, secret=EVENTS_SECRET).status_code == 200
    assert post(receiver.provider_url, "n-bad", b"{}", secret=EVENTS_SECRET).status_code == 400

    for mode in ("503", "429"):
        receiver.mode("provider", mode)
        answer = post(receiver.provider_url, "n-2", b"{}")
        assert (answer.status_code, answer.headers["Retry-After"]) == (int(mode), "1")

    receiver.mode("provider", "hang")
    with pytest.raises(httpx.ReadTimeout):
        post(receiver.provider_url, "n-3", b"{}", timeout=0.5)

    receiver.mode("events", "down")
    with pytest.raises(httpx.ConnectError):
        post(receiver.events_url, "evt_2", event, secret=EVENTS_SECRET)
    receiver.mode("events", "ok")
    receiver.mode("provider", "ok")
    assert post(receiver.events_url, "evt_3", event, secret=EVENTS_SECRET).status_code == 200
    assert post(receiver.provider_url, "n-4", b"{}").status_code == 200

    stats = receiver.stats()
    assert stats["provider"]["by_answer"] == {"200": 2, "503": 1, "429": 1, "held": 1, "bad_signature": 1}
    final, accepted = receiver.stop()
    assert final["events"]["accepted"] == 2
    assert [(target, webhook_id, notification_id) for target, webhook_id, notification_id, _ in accepted] == [
        ("provider", "n-1", "n-1"), ("provider", "n-4", "n-4"), ("events", "evt_1", "n-1"), ("events", "evt_3", "n-1"),
    ]  # fmt: skip
