"""The `mailto:` of List-Unsubscribe (unsubscribe@ the bounce domain, subject `unsubscribe <token>`) is
accepted by the bounce listener and applied like the one-click POST; it was answered 550, so a reader
who used it stayed subscribed."""

from __future__ import annotations

import re
import smtplib
from collections.abc import Iterator
from email.message import EmailMessage
from urllib.parse import parse_qs, urlsplit

import pytest

from providers import verp
from receipts.bounce_listener import BounceListener, ListenerConfig, unsubscribe_token
from recipients import unsubscribe
from recipients.models import Suppression
from tests.support.receivers import _LoopThread

DOMAIN = "bounces.omnipost.example"
ADDRESS = "Jane.Doe@example.com"


def start(**hooks: object) -> tuple[BounceListener, _LoopThread]:
    server = BounceListener(ListenerConfig(host="127.0.0.1", port=0, grace_seconds=1), **hooks)
    thread = _LoopThread("bounce-listener")
    thread.start()
    thread.run(server.start())
    return server, thread


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
def listener(settings, calls) -> Iterator[BounceListener]:
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN

    def fake(token: str) -> None:
        if token.startswith("forged"):
            raise unsubscribe.BadToken()
        calls.append(token)

    server, thread = start(unsubscribe=fake, resolve=lambda ids: {}, apply=lambda p, r: None)
    yield server
    thread.run(server.stop(), timeout=10)
    thread.stop()


def mail_link(settings, tenant_id: object, category: str = "general") -> tuple[str, str]:
    """(address, subject) of the mailto in the List-Unsubscribe header an email carries."""
    settings.OMNIPOST_PUBLIC_URL = "https://notify.example.com"
    header = dict(unsubscribe.headers(tenant_id, ADDRESS, category))["List-Unsubscribe"]
    mailto = next(t for t in re.findall(r"<([^>]+)>", header) if t.startswith("mailto:"))
    parts = urlsplit(mailto)
    return parts.path, parse_qs(parts.query)["subject"][0]


def send(listener: BounceListener, rcpts: list[str], subject: str) -> dict:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = ADDRESS, rcpts[0], subject
    message.set_content("Please unsubscribe me.")
    with smtplib.SMTP("127.0.0.1", listener.port, timeout=10) as client:
        return client.send_message(message, from_addr=ADDRESS, to_addrs=rcpts)


TOKEN = "gAAAAA" + "x" * 120


@pytest.mark.parametrize("subject", [f"unsubscribe {TOKEN}", f"Re: Unsubscribe {TOKEN}", f"UNSUBSCRIBE  {TOKEN}"])
def test_a_mail_to_the_unsubscribe_address_is_accepted_and_applied(listener, calls, subject):
    assert send(listener, [f"unsubscribe@{DOMAIN.upper()}"], subject) == {}
    assert calls == [TOKEN] and listener.counts["unsubscribed"] == 1


@pytest.mark.parametrize(("subject", "why"), [("unsubscribe forged" + "x" * 60, "not valid"),
                                              ("please unsubscribe me", "No unsubscribe token")])  # fmt: skip
def test_a_forged_or_missing_token_is_550_and_changes_nothing(listener, calls, subject, why):
    with pytest.raises(smtplib.SMTPDataError) as refused:
        send(listener, [f"unsubscribe@{DOMAIN}"], subject)
    assert refused.value.smtp_code == 550 and why in refused.value.smtp_error.decode()
    assert calls == [] and listener.counts["bad_unsubscribe"] == 1


def test_an_unsubscribe_and_a_report_do_not_share_a_message(listener, calls):
    report_address = verp.return_path(1, "00000000-0000-0000-0000-000000000001")
    refused = send(listener, [f"unsubscribe@{DOMAIN}", report_address], f"unsubscribe {TOKEN}")
    assert list(refused) == [report_address] and refused[report_address][0] == 452
    assert calls == [TOKEN]
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        send(listener, ["unsubscribe@other.example"], f"unsubscribe {TOKEN}")


def test_the_token_is_read_from_the_subject_only():
    assert unsubscribe_token(b"Subject: unsubscribe " + TOKEN.encode() + b"\r\n\r\nbody") == TOKEN
    assert unsubscribe_token(b"Subject: hello\r\n\r\nunsubscribe " + TOKEN.encode()) is None
    assert unsubscribe_token(b"Subject: =?utf-8?q?unsubscribe_" + TOKEN.encode() + b"?=\r\n\r\n") == TOKEN


@pytest.mark.django_db(transaction=True)
def test_the_mailto_of_a_real_email_opts_the_reader_out(settings, tenant_a):
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN
    to, subject = mail_link(settings, tenant_a.pk, "general")
    assert to == f"unsubscribe@{DOMAIN}"
    server, thread = start(resolve=lambda ids: {}, apply=lambda p, r: None)
    try:
        assert send(server, [to], subject) == {}
        assert send(server, [to], subject) == {}  # again: idempotent
    finally:
        thread.run(server.stop(), timeout=10)
        thread.stop()
    [suppression] = Suppression.objects.filter(tenant=tenant_a)
    assert (suppression.channel, suppression.reason, suppression.category) == ("email", "unsubscribed", "general")
