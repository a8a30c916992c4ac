"""The simulator's answers by recipient (the outcomes test keys can force), and the receipt that
follows an accepted email or SMS."""

from __future__ import annotations

import asyncio

import pytest

from providers.kinds import OutboundMessage
from providers.simulator import SIMULATOR, answer, receipt_for


@pytest.mark.parametrize(
    ("channel", "recipient", "expected"),
    [
        ("email", "delivered@simulator.test", ("delivered", "delivered", None)),
        ("email", "Bounce@Any.Example", ("delivered", "bounced", "hard")),
        ("email", "softbounce@x.org", ("delivered", "bounced", "soft")),
        ("email", "complaint@x.org", ("delivered", "complained", None)),
        ("email", "transient@x.org", ("transient", None, None)),
        ("email", "permanent@x.org", ("permanent", None, None)),
        ("email", "bounce.not@x.org", ("delivered", "delivered", None)),
        ("sms", "+15005550006", ("delivered", "delivered", None)),
        ("sms", "+1 (500) 555-0001", ("permanent", None, None)),
        ("sms", "+15005550009", ("delivered", "undelivered", None)),
        ("sms", "+15005550004", ("transient", None, None)),
        ("sms", "+15551234567", ("delivered", "delivered", None)),
        ("push", "tok_TRANSIENT_9", ("transient", None, None)),
        ("push", "tok_permanent", ("permanent", None, None)),
        ("push", "tok_fine", ("delivered", None, None)),
        ("webhook", "https://h.example/permanent", ("permanent", None, None)),
        ("webhook", "https://h.example/transient", ("transient", None, None)),
        ("webhook", "https://h.example/ok", ("delivered", None, None)),
        ("in_app", "user-1", ("delivered", None, None)),
    ],
)
def test_answers_by_recipient(channel, recipient, expected):
    assert answer(channel, recipient) == expected
    message = OutboundMessage(notification_id="n", tenant_id="t", channel=channel, recipient=recipient, subject="",
                              body="")  # fmt: skip
    result = asyncio.run(SIMULATOR.send(message))
    assert (result.delivered, result.permanent) == {
        "delivered": (True, None), "transient": (False, False), "permanent": (False, True)}[expected[0]]  # fmt: skip
    assert result.error_class == "simulator"
    followed = receipt_for("n", "t", 1, channel, recipient)
    got = None if followed is None else (followed.receipt, followed.bounce_type)
    assert got == ((expected[1], expected[2]) if expected[1] else None)
