"""The bounce listener over real SMTP (smtplib against the aiosmtpd server on loopback), with its
provider lookup and apply step recorded; tests/receipts/test_bounces_end_to_end.py runs it as a process."""

from __future__ import annotations

import smtplib
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import OperationalError

from providers import verp
from receipts.bounce_listener import BounceListener, ListenerConfig
from receipts.inbound import ProviderView, Receipt
from tests.queueing.dispatch_support import wait_until
from tests.receipts.test_bounce_parsing import sample
from tests.support.receivers import _LoopThread

DOMAIN = "bounces.omnipost.example"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[ProviderView, list[Receipt]]] = []
        self.failures: list[BaseException] = []  # raised by the next calls, in order
        self.known = {1, 2}
        self.lock = threading.Lock()

    def resolve(self, ids: set[int]) -> dict[int, ProviderView]:
        views = (ProviderView(id=i, tenant_id=f"tenant-{i}", kind="smtp", config={}, secrets={}) for i in ids)
        return {view.id: view for view in views if view.id in self.known}

    def apply(self, provider: ProviderView, receipts: list[Receipt]) -> str:
        with self.lock:
            if self.failures:
                raise self.failures.pop(0)
            self.calls.append((provider, receipts))
        return "applied"


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def listener(settings, recorder) -> Iterator[BounceListener]:
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN
    server = BounceListener(
        ListenerConfig(host="127.0.0.1", port=0, max_message_bytes=64 * 1024, grace_seconds=1),
        resolve=recorder.resolve,
        apply=recorder.apply,
    )
    thread = _LoopThread("bounce-listener")
    thread.start()
    thread.run(server.start())
    yield server
    thread.run(server.stop(), timeout=10)
    thread.stop()


def post(listener: BounceListener, rcpts: list[str], raw: bytes) -> dict:
    """Mail a report as an MTA does: null sender, CRLF lines (smtplib leaves bytes alone)."""
    with smtplib.SMTP("127.0.0.1", listener.port, timeout=10) as client:
        return client.sendmail("", rcpts, raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))


def test_a_hard_bounce_reaches_the_notification_its_return_path_names(listener, recorder):
    nid = str(uuid.uuid4())
    address = verp.return_path(1, nid)
    assert post(listener, [address], sample("postfix_user_unknown.eml", address)) == {}
    [(provider, [receipt])] = recorder.calls
    assert provider.id == 1 and provider.tenant_id == "tenant-1"
    assert (receipt.notification_id, receipt.type, receipt.receipt, receipt.bounce_type) == (
        nid, "bounced", "bounced", "hard"
    )  # fmt: skip
    assert receipt.event_id == "20261201180211.4Rk2Hc0xYz@mail.example.net"
    assert receipt.details["status"] == "5.1.1" and receipt.raw.startswith(b"Return-Path")


def test_a_complaint_and_a_case_folded_address(listener, recorder):
    nid = str(uuid.uuid4())
    address = verp.return_path(2, nid).upper()  # some relays upper-case the whole address
    post(listener, [address], sample("arf_rfc5965.eml", address))
    [(provider, [receipt])] = recorder.calls
    assert provider.id == 2 and (receipt.notification_id, receipt.receipt) == (nid, "complained")


def test_forged_tokens_and_foreign_addresses_are_refused_at_rcpt(listener, recorder):
    good = verp.return_path(1, str(uuid.uuid4()))
    token = good.split("@")[0][2:]
    forged = f"b+{token[:10]}{'a' if token[10] != 'a' else 'b'}{token[11:]}@{DOMAIN}"
    for rcpt in (forged, f"b+{token}@elsewhere.example", f"postmaster@{DOMAIN}", "jane@example.com"):
        with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
            post(listener, [rcpt], sample("postfix_user_unknown.eml"))
        assert refused.value.recipients[rcpt][0] == 550
    # A forged recipient beside a real one: only the real one is reached.
    refusals = post(listener, [forged, good], sample("postfix_user_unknown.eml"))
    assert refusals == {forged: (550, b"5.1.1 No such recipient here")}
    [(_, [receipt])] = recorder.calls
    assert receipt.notification_id == verp.read_address(good).notification_id
    assert listener.counts["refused_rcpt"] == 5


@pytest.mark.parametrize("name", ["out_of_office.eml", "qmail_plain_bounce.eml", "read_receipt_mdn.eml"])
def test_mail_that_is_no_report_is_refused_with_554(listener, recorder, name):
    address = verp.return_path(1, str(uuid.uuid4()))
    with pytest.raises(smtplib.SMTPDataError) as refused:
        post(listener, [address], sample(name, address))
    assert refused.value.smtp_code == 554 and not recorder.calls


def test_garbage_and_oversized_messages_are_answered_and_the_listener_goes_on(listener, recorder):
    address = verp.return_path(1, str(uuid.uuid4()))
    with pytest.raises(smtplib.SMTPDataError) as refused:
        post(listener, [address], b"Content-Type: multipart/report; boundary=\x00\xff\r\n\r\n\xfe\xfe--")
    assert refused.value.smtp_code == 554
    big = sample("postfix_user_unknown.eml", address) + (b"x" * 70 + b"\n") * 1500  # the fixture's limit: 64 KiB
    with pytest.raises(smtplib.SMTPSenderRefused) as declared:  # SIZE= declared at MAIL FROM
        post(listener, [address], big)
    assert declared.value.smtp_code == 552
    with smtplib.SMTP("127.0.0.1", listener.port, timeout=10) as client:  # not declared: refused while it streams
        client.ehlo()
        client.mail("")
        client.rcpt(address)
        assert client.data(big.replace(b"\n", b"\r\n"))[0] == 552
    post(listener, [address], sample("postfix_user_unknown.eml", address))
    assert len(recorder.calls) == 1


def test_a_session_lost_while_idle_is_replaced_and_the_report_applied(listener, recorder):
    recorder.failures.append(OperationalError("server closed the connection unexpectedly"))
    address = verp.return_path(1, str(uuid.uuid4()))
    assert post(listener, [address], sample("gmail_no_such_user.eml", address)) == {}
    assert len(recorder.calls) == 1 and listener.counts["try_later"] == 0


def test_a_database_that_stays_away_is_451_and_the_mtas_retry_is_applied(listener, recorder):
    lost = OperationalError("terminating connection due to administrator command")
    recorder.failures += [lost, lost]
    address = verp.return_path(1, str(uuid.uuid4()))
    with pytest.raises(smtplib.SMTPDataError) as later:
        post(listener, [address], sample("gmail_no_such_user.eml", address))
    assert later.value.smtp_code == 451 and not recorder.calls
    post(listener, [address], sample("gmail_no_such_user.eml", address))
    assert len(recorder.calls) == 1 and listener.counts["try_later"] == 1


def test_any_other_failure_while_applying_is_451_not_a_crash(listener, recorder):
    recorder.failures.append(ValueError("an adapter mistake"))
    address = verp.return_path(1, str(uuid.uuid4()))
    with pytest.raises(smtplib.SMTPDataError) as later:
        post(listener, [address], sample("postfix_success.eml", address))
    assert later.value.smtp_code == 451
    assert post(listener, [address], sample("postfix_success.eml", address)) == {}


def test_several_return_paths_in_one_transaction_and_an_unknown_provider(listener, recorder):
    a, b, gone = (str(uuid.uuid4()) for _ in range(3))
    rcpts = [verp.return_path(1, a), verp.return_path(2, b), verp.return_path(99, gone)]
    post(listener, rcpts, sample("postfix_success.eml"))
    assert sorted((p.id, [r.notification_id for r in rs]) for p, rs in recorder.calls) == [(1, [a]), (2, [b])]
    assert listener.counts["unknown_provider"] == 1


def test_stop_closes_idle_sessions_and_refuses_new_connections(settings, recorder):
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN
    server = BounceListener(ListenerConfig(port=0), resolve=recorder.resolve, apply=recorder.apply)
    thread = _LoopThread("bounce-listener")
    thread.start()
    try:
        thread.run(server.start())
        idle = smtplib.SMTP("127.0.0.1", server.port, timeout=5)
        idle.ehlo()
        started = time.monotonic()
        thread.run(server.stop(), timeout=10)
        assert time.monotonic() - started < 2  # nothing in flight: no waiting for the grace period
        with pytest.raises((smtplib.SMTPServerDisconnected, OSError)):
            idle.noop()
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=2):
            pass
    finally:
        thread.stop()


def test_stop_lets_a_report_being_applied_finish_within_the_grace(settings, recorder):
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN
    release = threading.Event()
    entered = threading.Event()

    def slow_apply(provider, receipts):  # noqa: ANN001, ANN202
        entered.set()
        release.wait(5)
        return recorder.apply(provider, receipts)

    server = BounceListener(ListenerConfig(port=0, grace_seconds=5), resolve=recorder.resolve, apply=slow_apply)
    thread = _LoopThread("bounce-listener")
    thread.start()
    answers: list[object] = []
    try:
        thread.run(server.start())
        address = verp.return_path(1, str(uuid.uuid4()))
        client = threading.Thread(
            target=lambda: answers.append(post(server, [address], sample("postfix_user_unknown.eml", address)))
        )
        client.start()
        assert entered.wait(5)
        threading.Timer(0.3, release.set).start()
        started = time.monotonic()
        thread.run(server.stop(), timeout=10)
        assert 0.2 < time.monotonic() - started < 3  # waited for the report, not for the whole grace
        client.join(5)
        assert answers == [{}] and len(recorder.calls) == 1  # the MTA got its 250
    finally:
        release.set()
        thread.stop()


@pytest.mark.django_db
def test_load_providers_reads_smtp_providers_only_in_one_statement(tenant_a, tenant_b, django_assert_num_queries):
    from receipts.bounce_listener import load_providers
    from tests import factories

    config = {"host": "127.0.0.1", "port": 2525, "from_email": "alerts@omnipost.example"}
    mail_a = factories.provider(tenant_a, "mail", channel="email", kind="smtp", config=config, secrets={})
    mail_b = factories.provider(tenant_b, "mail", channel="email", kind="smtp", config=config, secrets={})
    hook = factories.provider(tenant_a, "hook")
    with django_assert_num_queries(1):
        views = load_providers({mail_a.pk, mail_b.pk, hook.pk, 10**9})
    assert set(views) == {mail_a.pk, mail_b.pk}  # a webhook provider's id in a token is ignored
    assert (views[mail_a.pk].tenant_id, views[mail_a.pk].name) == (str(tenant_a.pk), "mail")
    assert views[mail_b.pk].tenant_id == str(tenant_b.pk) and views[mail_b.pk].secrets == {}


def test_connections_past_the_limit_are_told_to_come_back_later(settings, recorder):
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN
    server = BounceListener(ListenerConfig(port=0, max_sessions=2), resolve=recorder.resolve, apply=recorder.apply)
    thread = _LoopThread("bounce-listener")
    thread.start()
    try:
        thread.run(server.start())
        first, second = (smtplib.SMTP("127.0.0.1", server.port, timeout=5) for _ in range(2))
        with pytest.raises(smtplib.SMTPConnectError) as refused:
            smtplib.SMTP("127.0.0.1", server.port, timeout=5)
        assert refused.value.smtp_code == 421
        first.quit()
        assert wait_until(lambda: len(server._sessions) == 1, 2)
        address = verp.return_path(1, str(uuid.uuid4()))
        assert post(server, [address], sample("postfix_success.eml", address)) == {}  # a slot is free again
        second.quit()
        thread.run(server.stop(), timeout=10)
    finally:
        thread.stop()
