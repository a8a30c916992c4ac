"""Reading mailed reports: RFC 3464 DSNs as Postfix, Exchange Online and Gmail send them, RFC 5965 ARF."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from receipts.bounces import NotAReport, classify_dsn, parse_report

REPORTS = Path(__file__).parent / "reports"
NOW = datetime(2026, 12, 1, 20, 0, tzinfo=UTC)


def sample(name: str, rcpt: str = "b+token@bounces.omnipost.example") -> bytes:
    return (REPORTS / name).read_bytes().replace(b"{{RCPT}}", rcpt.encode())


@pytest.mark.parametrize(
    ("name", "type_", "receipt", "bounce_type", "status", "occurred_at"),
    [
        ("postfix_user_unknown.eml", "bounced", "bounced", "hard", "5.1.1", "2026-12-01T18:02:10+00:00"),
        ("postfix_delayed.eml", "delayed", None, None, "4.4.1", "2026-12-01T18:02:10+00:00"),
        ("postfix_expired.eml", "bounced", "bounced", "soft", "4.4.7", "2026-12-01T18:02:10+00:00"),
        ("postfix_success.eml", "delivered", "delivered", None, "2.0.0", "2026-12-01T18:02:10+00:00"),
        ("exchange_online_recipient_not_found.eml", "bounced", "bounced", "hard", "5.1.10", "2026-12-01T18:04:59Z"),
        ("gmail_no_such_user.eml", "bounced", "bounced", "hard", "5.1.1", "2026-12-01T18:03:05+00:00"),
        ("gmail_over_quota.eml", "bounced", "bounced", "soft", "5.2.2", "2026-12-01T18:13:05+00:00"),
        ("outlook_policy_block.eml", "bounced", "bounced", "soft", "5.7.1", "2026-12-01T18:20:00+00:00"),
        ("global_dsn_utf8.eml", "bounced", "bounced", "hard", "5.1.1", "2026-12-01T18:29:58+00:00"),
    ],
)
def test_delivery_status_notifications(name, type_, receipt, bounce_type, status, occurred_at):
    report = parse_report(sample(name), now=NOW)
    assert (report.type, report.receipt, report.bounce_type) == (type_, receipt, bounce_type)
    assert report.details["source"] == "dsn" and report.details["status"] == status
    assert report.occurred_at == datetime.fromisoformat(occurred_at)
    assert report.event_id and "<" not in report.event_id


@pytest.mark.parametrize(
    ("name", "type_", "receipt", "feedback_type", "event_id"),
    [
        ("arf_rfc5965.eml", "complained", "complained", "abuse", "arf-0001@abuse.example.com"),
        ("arf_yahoo_style.eml", "complained", "complained", "abuse", "12345.yahoo-fbl@fbl.mail.yahoo.com"),
        ("arf_not_spam.eml", "not_spam", None, "not-spam", "not-spam-1@mailbox.example"),
    ],
)
def test_feedback_reports(name, type_, receipt, feedback_type, event_id):
    report = parse_report(sample(name), now=NOW)
    assert (report.type, report.receipt, report.bounce_type) == (type_, receipt, None)
    assert report.details["source"] == "arf" and report.details["feedback_type"] == feedback_type
    assert report.event_id == event_id


@pytest.mark.parametrize("name", ["out_of_office.eml", "qmail_plain_bounce.eml", "read_receipt_mdn.eml"])
def test_other_mail_is_not_a_report(name):
    with pytest.raises(NotAReport):
        parse_report(sample(name), now=NOW)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\xff garbage",
        b"Content-Type: multipart/report; report-type=delivery-status; boundary=x\n\n--x\n\n--x--\n",
        b"Content-Type: multipart/report; report-type=delivery-status; boundary=x\n\n--x\n"
        b"Content-Type: message/delivery-status\n\nReporting-MTA: dns; a\n\n--x--\n",  # no per-recipient block
        b"Content-Type: multipart/report; report-type=delivery-status; boundary=x\n\n--x\n"
        b"Content-Type: message/delivery-status\n\nReporting-MTA: dns; a\n\nAction: exploded\n\n--x--\n",
        b"Content-Type: multipart/report; report-type=feedback-report; boundary=x\n\n--x\n"
        b"Content-Type: message/feedback-report\n\nUser-Agent: x\n\n--x--\n",  # no Feedback-Type
    ],
)
def test_malformed_reports_are_refused_not_crashes(raw):
    with pytest.raises(NotAReport):
        parse_report(raw, now=NOW)


def test_details_never_carry_the_recipient_address():
    for path in REPORTS.glob("*.eml"):
        try:
            report = parse_report(sample(path.name), now=NOW)
        except NotAReport:
            continue
        text = repr(report.details)
        for address in ("jane.doe@", "no.such.user@", "full.inbox@", "someone@outlook", "用户@", "user@example.com"):
            assert address not in text, (path.name, text)
    hard = parse_report(sample("postfix_user_unknown.eml"), now=NOW)
    assert "j***@example.com" in hard.details["diagnostic_code"]  # masked, still useful to an operator
    assert "5.1.1" in hard.details["diagnostic_code"] and "User unknown" in hard.details["diagnostic_code"]


def test_an_encoded_delivery_status_part_and_a_missing_message_id():
    raw = sample("postfix_user_unknown.eml").decode()
    head, _, rest = raw.partition("Content-Type: message/delivery-status\n\n")
    body, _, tail = rest.partition("\n--4Rk2Hc0xYz")
    encoded = base64.encodebytes(body.encode()).decode()
    raw = head + "Content-Type: message/delivery-status\nContent-Transfer-Encoding: base64\n\n" + encoded
    raw += "\n--4Rk2Hc0xYz" + tail
    raw = re.sub(r"Message-Id: .*\n", "", raw)
    report = parse_report(raw.encode(), now=NOW)
    assert (report.receipt, report.bounce_type, report.event_id) == ("bounced", "hard", "")
    receipt = report.receipt_for("5d2c6b64-54a1-4f6e-9d0b-6b1f3f2a9c11", raw.encode())
    assert receipt.dedup_key.startswith("sha256:")  # the hash of the report de-duplicates instead


def test_dates_in_the_future_and_missing_dates_fall_back():
    raw = sample("postfix_success.eml").replace(b"Arrival-Date: Tue,  1 Dec 2026", b"Arrival-Date: Tue,  1 Dec 2099")
    assert parse_report(raw, now=NOW).occurred_at == datetime(2026, 12, 1, 18, 2, 12, tzinfo=UTC)  # the Date header
    raw = re.sub(rb"(Arrival-Date|Date): [^\n]*\n", b"", raw)
    assert parse_report(raw, now=NOW).occurred_at == NOW


def test_the_most_severe_recipient_block_decides():
    raw = sample("postfix_success.eml").replace(
        b"Diagnostic-Code: smtp; 250 2.0.0 Ok: queued as 3Yz8pQ1abc\n",
        b"Diagnostic-Code: smtp; 250 2.0.0 Ok\n\n"
        b"Final-Recipient: rfc822; x@example.com\nAction: failed\nStatus: 5.1.1\n",
    )
    report = parse_report(raw, now=NOW)
    assert (report.receipt, report.bounce_type, report.details["status"]) == ("bounced", "hard", "5.1.1")


@pytest.mark.parametrize(
    ("action", "status", "expected"),
    [
        ("failed", "5.1.1", ("bounced", "bounced", "hard")),
        ("Failed", "5.0.0 (permanent failure)", ("bounced", "bounced", "hard")),
        ("failed", "5.4.4", ("bounced", "bounced", "hard")),  # no route to the domain
        ("failed", "5.2.1", ("bounced", "bounced", "hard")),  # mailbox disabled
        ("failed", "5.2.2", ("bounced", "bounced", "soft")),  # mailbox full
        ("failed", "5.3.4", ("bounced", "bounced", "soft")),  # message too big
        ("failed", "5.6.1", ("bounced", "bounced", "soft")),  # content
        ("failed", "5.7.26", ("bounced", "bounced", "soft")),  # policy: unauthenticated mail
        ("failed", "4.4.7", ("bounced", "bounced", "soft")),
        ("failed", "", ("bounced", "bounced", "soft")),
        ("delayed", "4.4.1", ("delayed", None, None)),
        ("delivered", "2.0.0", ("delivered", "delivered", None)),
        ("relayed", "2.0.0", ("relayed", None, None)),
        ("expanded", "2.0.0", ("expanded", None, None)),
    ],
)
def test_classification_table(action, status, expected):
    assert classify_dsn(action, status) == expected


def test_an_unknown_action_is_not_a_report():
    with pytest.raises(NotAReport):
        classify_dsn("vanished", "5.1.1")
