"""SMTP provider against a real aiosmtpd server on loopback."""

from __future__ import annotations

import asyncio
import socket
import uuid
from datetime import UTC, datetime

import pytest
from rest_framework.exceptions import ValidationError

from dlq.classifier import classify
from providers.kinds import build_provider
from providers.kinds.base import OutboundMessage
from providers.kinds.smtp import SmtpProvider
from tests.support.receivers import SmtpSink, make_tls_material

FROM = "alerts@omnipost.example"


def message(recipient: str = "jane.doe@example.com", **overrides) -> OutboundMessage:
    fields = {
        "notification_id": str(uuid.uuid4()),
        "tenant_id": str(uuid.uuid4()),
        "channel": "email",
        "recipient": recipient,
        "subject": "Your receipt",
        "body": "Thanks for your order.\nLine two — ünïcode.",
        "metadata": {},
        "created_at": datetime.now(UTC),
        "attempt": 1,
    }
    fields.update(overrides)
    return OutboundMessage(**fields)


def send(config: dict, secrets: dict | None = None, msg: OutboundMessage | None = None, **options):
    provider = build_provider("smtp", {"from_email": FROM, **config}, secrets or {}, **options)
    return asyncio.run(provider.send(msg or message()))


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls_material(tmp_path_factory.mktemp("smtp-tls"))


def test_plain_delivery_carries_ids_and_headers():
    with SmtpSink() as sink:
        msg = message()
        result = send({"host": "127.0.0.1", "port": sink.port}, msg=msg)
        assert result.delivered and result.error_code == ""
        [mail] = sink.messages
    email = mail.message
    assert mail.mail_from == FROM and mail.rcpt_tos == ["jane.doe@example.com"]
    assert email["From"] == FROM and email["To"] == "jane.doe@example.com"
    assert email["Subject"] == "Your receipt"
    assert msg.notification_id in email["Message-ID"]
    assert email["X-OmniPost-Notification-Id"] == msg.notification_id
    assert email.get_content().strip() == msg.body
    assert mail.authenticated_as is None and mail.tls is False


def test_auth_with_username_and_password():
    with SmtpSink(auth=("mailer", "s3cret-pass")) as sink:
        ok = send({"host": "127.0.0.1", "port": sink.port, "username": "mailer"}, {"password": "s3cret-pass"})
        assert ok.delivered
        assert sink.messages[0].authenticated_as == "mailer"

        wrong = send({"host": "127.0.0.1", "port": sink.port, "username": "mailer"}, {"password": "nope-nope"})
        assert (wrong.delivered, wrong.error_code, wrong.permanent) == (False, "smtp_535", True)
        assert "nope-nope" not in wrong.message
        assert sink.auth_failures >= 1  # smtplib tries each offered mechanism

        anonymous = send({"host": "127.0.0.1", "port": sink.port})
        assert anonymous.error_code == "smtp_530" and classify(anonymous).outcome == "permanent_error"
        assert len(sink.messages) == 1


def test_550_rejection_is_permanent_and_masked():
    with SmtpSink(reject={"nobody@example.com": "550 5.1.1 <nobody@example.com>: no such user"}) as sink:
        result = send({"host": "127.0.0.1", "port": sink.port}, msg=message("nobody@example.com"))
        assert (result.delivered, result.error_code, result.permanent) == (False, "smtp_550", True)
        assert result.error_class == "SMTPRecipientsRefused"
        assert "nobody@example.com" not in result.message and "n***@example.com" in result.message
        assert classify(result).failure_class == "permanent"
        assert sink.messages == [] and sink.rejected == ["nobody@example.com"]


def test_4xx_reply_is_transient():
    with SmtpSink(data_reply="451 4.3.0 mailbox busy, try later") as sink:
        result = send({"host": "127.0.0.1", "port": sink.port})
        assert (result.error_code, result.permanent) == ("smtp_451", False)
        assert classify(result).outcome == "transient_error"


def test_connection_refused_is_transient():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = send({"host": "127.0.0.1", "port": port})
    assert result.error_code == "connect_error" and classify(result).outcome == "transient_error"


def test_starttls_verifies_the_host_name(tls):
    with SmtpSink(starttls_context=tls.server_context, auth=("mailer", "pw-123456")) as sink:
        config = {"host": "localhost", "port": sink.port, "use_tls": True, "username": "mailer"}
        ok = send(config, {"password": "pw-123456"}, ssl_context=tls.client_context())
        assert ok.delivered
        assert sink.messages[0].tls is True and sink.messages[0].authenticated_as == "mailer"
        assert "localhost" in tls.sni_names
        untrusted = send(config, {"password": "pw-123456"})  # system trust store: self-signed refused
        assert untrusted.error_code == "tls_error" and classify(untrusted).outcome == "transient_error"
        assert len(sink.messages) == 1


def test_implicit_tls(tls):
    with SmtpSink(implicit_tls_context=tls.server_context) as sink:
        result = send({"host": "localhost", "port": sink.port, "use_ssl": True}, ssl_context=tls.client_context())
        assert result.delivered and sink.messages[0].tls is True


def test_starttls_required_but_not_offered_is_permanent():
    with SmtpSink() as sink:
        result = send({"host": "127.0.0.1", "port": sink.port, "use_tls": True})
        assert (result.error_code, result.permanent) == ("smtp_unsupported", True)


def test_invalid_recipient_and_header_injection_are_permanent():
    with SmtpSink() as sink:
        bad_address = send({"host": "127.0.0.1", "port": sink.port}, msg=message("not-an-address"))
        assert (bad_address.error_code, bad_address.permanent) == ("invalid_recipient", True)
        injected = send({"host": "127.0.0.1", "port": sink.port}, msg=message(subject="Hi\r\nBcc: x@example.com"))
        assert (injected.error_code, injected.permanent) == ("malformed_content", True)
        assert sink.messages == []


# -- validation ----------------------------------------------------------------------------
def test_validate_normalises_defaults():
    config = SmtpProvider.validate({"host": "smtp.example.com", "from_email": FROM, "use_tls": True}, {})
    assert config == {
        "host": "smtp.example.com",
        "port": 587,
        "use_tls": True,
        "use_ssl": False,
        "from_email": FROM,
        "username": "",
        "timeout_seconds": 30.0,
    }
    assert SmtpProvider.validate({"host": "h.example", "from_email": FROM, "use_ssl": True}, {})["port"] == 465
    assert SmtpProvider.validate({"host": "h.example", "from_email": FROM}, {})["port"] == 25


@pytest.mark.parametrize(
    ("config", "secrets", "section", "field"),
    [
        ({"from_email": FROM}, {}, "config", "host"),
        ({"host": "h.example"}, {}, "config", "from_email"),
        ({"host": "h.example", "from_email": "nope"}, {}, "config", "from_email"),
        ({"host": "h.example", "from_email": FROM, "port": 0}, {}, "config", "port"),
        ({"host": "h.example", "from_email": FROM, "port": "25"}, {}, "config", "port"),
        ({"host": "h.example", "from_email": FROM, "use_tls": True, "use_ssl": True}, {}, "config", "use_ssl"),
        ({"host": "h.example", "from_email": FROM, "use_tls": "yes"}, {}, "config", "use_tls"),
        ({"host": "h.example", "from_email": FROM, "username": "u"}, {}, "secrets", "password"),
        ({"host": "h.example", "from_email": FROM, "password": "x"}, {}, "config", "password"),
        ({"host": "h.example", "from_email": FROM}, {"api_key": "x"}, "secrets", "api_key"),
    ],
)
def test_validate_rejects_bad_config(config, secrets, section, field):
    with pytest.raises(ValidationError) as excinfo:
        SmtpProvider.validate(config, secrets, check_destination=False)
    assert excinfo.value.detail[section][field]
