"""Console provider: logs the masked message and always delivers."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime

import pytest
from rest_framework.exceptions import ValidationError

from providers.kinds import build_provider
from providers.kinds.base import OutboundMessage
from providers.kinds.console import ConsoleProvider


@pytest.mark.parametrize(
    ("channel", "recipient", "masked"),
    [("email", "jane.doe@example.com", "j***@example.com"), ("sms", "+15551234567", "+1******4567")],
)
def test_logs_masked_recipient_and_delivers(caplog, channel, recipient, masked):
    msg = OutboundMessage(
        str(uuid.uuid4()), "tenant-1", channel, recipient, "Hello", "Call me at +15559876543", {}, datetime.now(UTC), 2
    )
    provider = build_provider("console", {}, {})
    with caplog.at_level(logging.INFO, logger="omnipost.delivery"):
        result = asyncio.run(provider.send(msg))
    assert result.delivered
    [record] = [r for r in caplog.records if r.name == "omnipost.delivery"]
    assert record.levelno == logging.INFO
    text = record.getMessage()
    assert masked in text and recipient not in text
    assert "+15559876543" not in text and msg.notification_id in text
    assert (record.notification_id, record.tenant_id, record.attempt) == (msg.notification_id, "tenant-1", 2)


def test_validate_accepts_only_empty_config():
    assert ConsoleProvider.validate({}, {}) == {}
    with pytest.raises(ValidationError) as excinfo:
        ConsoleProvider.validate({"url": "x"}, {})
    assert excinfo.value.detail["config"]["url"]
