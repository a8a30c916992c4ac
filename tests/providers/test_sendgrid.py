"""SendGrid provider against a loopback stand-in for the v3 Mail Send API."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from rest_framework.exceptions import ValidationError

from dlq.classifier import classify
from providers.kinds import REGISTRY, build_provider
from providers.kinds.base import OutboundMessage
from providers.kinds.sendgrid import SendgridProvider
from tests.support.receivers import HttpReceiver

API_KEY = "SG.abcdefghijklmnopqrstuv.0123456789abcdefghijklmnopqrstuvwxyzABCDE"
FROM = "alerts@example.com"
TO = "jane.doe@example.com"


def spki(key) -> str:
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der).decode()


PUBLIC_KEY = spki(ec.generate_private_key(ec.SECP256R1()))


def message(recipient: str = TO) -> OutboundMessage:
    return OutboundMessage(
        str(uuid.uuid4()), str(uuid.uuid4()), "email", recipient, "Your code", "Code: 123456", {}, datetime.now(UTC), 1
    )


def send(receiver: HttpReceiver, msg: OutboundMessage | None = None):
    async def run():
        provider = build_provider(
            "sendgrid",
            {"base_url": f"http://127.0.0.1:{receiver.port}/", "from_email": FROM, "public_key": PUBLIC_KEY},
            {"api_key": API_KEY},
        )
        try:
            return await provider.send(msg or message())
        finally:
            await provider.aclose()

    return asyncio.run(run())


@pytest.fixture
def sendgrid():
    with HttpReceiver(status=202, body=b"", headers={"X-Message-Id": "W9yQ2v1dSmq3nuNqbkW8Ow"}) as rx:
        yield rx


def test_registered():
    assert REGISTRY["sendgrid"] is SendgridProvider


def test_posts_mail_send_json_with_bearer_key_and_notification_custom_arg(sendgrid):
    msg = message()
    result = send(sendgrid, msg)
    assert result.delivered and result.http_status == 202
    assert "W9yQ2v1dSmq3nuNqbkW8Ow" in result.message
    [req] = sendgrid.requests
    assert (req.method, req.path) == ("POST", "/v3/mail/send")
    assert req.headers["authorization"] == f"Bearer {API_KEY}"
    assert req.headers["content-type"] == "application/json"
    assert req.payload == {
        "personalizations": [{"to": [{"email": TO}]}],
        "from": {"email": FROM},
        "subject": "Your code",
        "content": [{"type": "text/plain", "value": "Code: 123456"}],
        "custom_args": {"notification_id": msg.notification_id},
    }


def test_recipient_errors_are_permanent_invalid_recipient(sendgrid):
    error = {"errors": [{"message": f"Does not contain a valid address: {TO}",
                         "field": "personalizations.0.to.0.email"}]}  # fmt: skip
    sendgrid.configure(status=400, error_body=json.dumps(error).encode())
    result = send(sendgrid)
    assert (result.error_code, result.permanent, result.http_status) == ("invalid_recipient", True, 400)
    assert classify(result).outcome == "permanent_error"
    assert TO not in result.message and "j***@example.com" in result.message


def test_content_errors_are_malformed_content(sendgrid):
    error = {"errors": [{"message": "The subject is required.", "field": "subject"}]}
    sendgrid.configure(status=400, error_body=json.dumps(error).encode())
    assert send(sendgrid).error_code == "malformed_content"
    sendgrid.configure(status=413, error_body=b'{"errors": [{"message": "too large"}]}')
    assert send(sendgrid).error_code == "malformed_content"


def test_auth_failure_is_permanent_and_never_echoes_the_key(sendgrid):
    sendgrid.configure(status=401, error_body=json.dumps({"errors": [{"message": f"bad key {API_KEY}"}]}).encode())
    denied = send(sendgrid)
    assert denied.error_code == "http_401" and classify(denied).outcome == "permanent_error"
    assert API_KEY not in denied.message
    unverified = b'{"errors": [{"message": "from address not verified", "field": "from"}]}'
    sendgrid.configure(status=403, error_body=unverified)
    assert classify(send(sendgrid)).outcome == "permanent_error"


def test_rate_limit_honours_x_ratelimit_reset_and_5xx_is_transient(sendgrid):
    reset = int(time.time()) + 20
    sendgrid.configure(status=429, error_body=b'{"errors": [{"message": "too many requests"}]}',
                       headers={"X-RateLimit-Reset": str(reset)})  # fmt: skip
    limited = send(sendgrid)
    assert limited.error_code == "http_429" and classify(limited).outcome == "transient_error"
    assert 15 <= limited.retry_after <= 20
    sendgrid.configure(status=429, retry_after="7", headers={})
    assert send(sendgrid).retry_after == 7.0
    sendgrid.configure(status=503, retry_after=None, error_body=b"<html>down</html>")
    down = send(sendgrid)
    assert down.error_code == "http_503" and classify(down).outcome == "transient_error"


def test_redirect_is_permanent(sendgrid):
    sendgrid.configure(status=302, location="http://elsewhere.example/")
    result = send(sendgrid)
    assert (result.error_code, classify(result).outcome) == ("redirect", "permanent_error")
    assert sendgrid.stats()["requests"] == 1


def test_unreachable_api_is_transient():
    with HttpReceiver() as rx:
        port = rx.port
    result = send(type("Gone", (), {"port": port})())
    assert result.error_code == "connect_error" and classify(result).outcome == "transient_error"


def test_validate_normalises_and_defaults_base_url():
    config = SendgridProvider.validate(
        {"from_email": FROM, "public_key": f"  {PUBLIC_KEY[:40]}\n{PUBLIC_KEY[40:]} "},
        {"api_key": API_KEY},
        check_destination=False,
    )
    assert config == {"base_url": "https://api.sendgrid.com", "from_email": FROM, "public_key": PUBLIC_KEY}
    without_key = SendgridProvider.validate({"from_email": FROM}, {"api_key": API_KEY}, check_destination=False)
    assert without_key["public_key"] == ""


@pytest.mark.parametrize(
    ("config", "secrets", "section", "field"),
    [
        ({}, {"api_key": API_KEY}, "config", "from_email"),
        ({"from_email": "not-an-address"}, {"api_key": API_KEY}, "config", "from_email"),
        ({"from_email": FROM, "base_url": "ftp://x"}, {"api_key": API_KEY}, "config", "base_url"),
        ({"from_email": FROM, "base_url": "https://x/?a=1"}, {"api_key": API_KEY}, "config", "base_url"),
        ({"from_email": FROM, "public_key": "not base64!"}, {"api_key": API_KEY}, "config", "public_key"),
        ({"from_email": FROM, "public_key": spki(rsa.generate_private_key(65537, 2048))}, {"api_key": API_KEY},
         "config", "public_key"),  # fmt: skip
        ({"from_email": FROM, "public_key": spki(ec.generate_private_key(ec.SECP384R1()))}, {"api_key": API_KEY},
         "config", "public_key"),  # fmt: skip
        ({"from_email": FROM, "extra": 1}, {"api_key": API_KEY}, "config", "extra"),
        ({"from_email": FROM}, {}, "secrets", "api_key"),
        ({"from_email": FROM}, {"api_key": "SG.a\r\nX-Injected: 1"}, "secrets", "api_key"),
    ],
)
def test_validate_rejects_bad_config(config, secrets, section, field):
    with pytest.raises(ValidationError) as excinfo:
        SendgridProvider.validate(config, secrets, check_destination=False)
    assert excinfo.value.detail[section][field]


def test_private_base_url_is_refused_at_save_time_unless_allowed(settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    with pytest.raises(ValidationError) as excinfo:
        SendgridProvider.validate({"from_email": FROM, "base_url": "http://127.0.0.1:8025"}, {"api_key": API_KEY})
    assert excinfo.value.detail["config"]["base_url"]


def test_send_refuses_a_private_destination_when_not_allowed(sendgrid, settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    result = send(sendgrid)
    assert (result.error_code, classify(result).outcome) == ("destination_forbidden", "permanent_error")
    assert sendgrid.stats()["requests"] == 0
