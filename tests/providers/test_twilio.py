"""Twilio provider against a loopback stand-in for the Messages API."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from datetime import UTC, datetime
from urllib.parse import parse_qs

import pytest
from rest_framework.exceptions import ValidationError

from dlq.classifier import classify
from providers.kinds import build_provider
from providers.kinds.base import OutboundMessage
from providers.kinds.twilio import TwilioProvider
from tests.support.receivers import HttpReceiver

SID = "AC" + "0123456789abcdef" * 2
TOKEN = "auth-token-0123456789abcdef"
FROM = "+15005550006"


def message(recipient: str = "+15551234567") -> OutboundMessage:
    return OutboundMessage(
        str(uuid.uuid4()), str(uuid.uuid4()), "sms", recipient, "", "Your code is 123456", {}, datetime.now(UTC), 1
    )


def send(receiver: HttpReceiver, msg: OutboundMessage | None = None):
    async def run():
        provider = build_provider(
            "twilio",
            {"account_sid": SID, "from_number": FROM, "base_url": f"http://127.0.0.1:{receiver.port}/"},
            {"auth_token": TOKEN},
        )
        try:
            return await provider.send(msg or message())
        finally:
            await provider.aclose()

    return asyncio.run(run())


@pytest.fixture
def twilio():
    with HttpReceiver(status=201, body=b'{"sid": "SM0123456789abcdef0123456789abcdef", "status": "queued"}') as rx:
        yield rx


def test_posts_form_with_basic_auth_to_messages_endpoint(twilio):
    result = send(twilio)
    assert result.delivered and result.http_status == 201
    assert "SM0123456789abcdef" in result.message
    [req] = twilio.requests
    assert req.method == "POST"
    assert req.path == f"/2010-04-01/Accounts/{SID}/Messages.json"
    assert req.headers["content-type"] == "application/x-www-form-urlencoded"
    scheme, _, credentials = req.headers["authorization"].partition(" ")
    assert scheme == "Basic" and base64.b64decode(credentials).decode() == f"{SID}:{TOKEN}"
    assert parse_qs(req.body.decode()) == {"To": ["+15551234567"], "From": [FROM], "Body": ["Your code is 123456"]}


@pytest.mark.parametrize("code", [21211, 21614, 21610])
def test_unreachable_recipient_is_permanent_invalid_recipient(twilio, code):
    error = {"code": code, "message": "The 'To' number +15551234567 is not a valid phone number.", "status": 400}
    twilio.configure(status=400, error_body=json.dumps(error).encode())
    result = send(twilio)
    assert (result.delivered, result.error_code, result.permanent, result.http_status) == (
        False,
        "invalid_recipient",
        True,
        400,
    )
    assert "+15551234567" not in result.message and "4567" in result.message
    assert TOKEN not in result.message


def test_auth_failure_is_permanent_and_rate_limit_is_transient(twilio):
    twilio.configure(status=401, error_body=b'{"code": 20003, "message": "Authenticate", "status": 401}')
    denied = send(twilio)
    assert denied.error_code == "twilio_20003" and classify(denied).outcome == "permanent_error"
    twilio.configure(status=429, retry_after="3", error_body=b'{"code": 20429, "message": "Too Many Requests"}')
    limited = send(twilio)
    assert (limited.error_code, limited.retry_after) == ("twilio_20429", 3.0)
    assert classify(limited).outcome == "transient_error"
    twilio.configure(status=503, retry_after=None, error_body=b"<html>down</html>")
    down = send(twilio)
    assert down.error_code == "http_503" and classify(down).outcome == "transient_error"


def test_non_e164_recipient_is_refused_without_a_request(twilio):
    result = send(twilio, message("555-1234"))
    assert (result.error_code, result.permanent) == ("invalid_recipient", True)
    assert twilio.stats()["requests"] == 0


def test_validate_normalises_and_defaults_base_url():
    config = TwilioProvider.validate(
        {"account_sid": SID, "from_number": FROM}, {"auth_token": TOKEN}, check_destination=False
    )
    assert config == {"account_sid": SID, "from_number": FROM, "base_url": "https://api.twilio.com"}


@pytest.mark.parametrize(
    ("config", "secrets", "section", "field"),
    [
        ({"from_number": FROM}, {"auth_token": TOKEN}, "config", "account_sid"),
        ({"account_sid": "AC123", "from_number": FROM}, {"auth_token": TOKEN}, "config", "account_sid"),
        ({"account_sid": SID, "from_number": "5551234"}, {"auth_token": TOKEN}, "config", "from_number"),
        ({"account_sid": SID, "from_number": FROM, "base_url": "ftp://x"}, {"auth_token": TOKEN}, "config", "base_url"),
        ({"account_sid": SID, "from_number": FROM}, {}, "secrets", "auth_token"),
    ],
)
def test_validate_rejects_bad_config(config, secrets, section, field):
    with pytest.raises(ValidationError) as excinfo:
        TwilioProvider.validate(config, secrets, check_destination=False)
    assert excinfo.value.detail[section][field]
