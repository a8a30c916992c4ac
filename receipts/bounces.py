"""Bounce and complaint reports mailed to a VERP return path, read into receipts.

Two report formats are understood, both `multipart/report` messages:

- RFC 3464 delivery status notifications (`report-type=delivery-status`; `message/delivery-status`,
  or RFC 6533's `message/global-delivery-status`). Each per-recipient block has an `Action` and a
  `Status`; the most severe block decides (`failed` > `delivered` > `delayed` > `relayed`/`expanded`):

  | Action | Status | receipt | bounce_type | event type |
  |---|---|---|---|---|
  | failed | 5.x.x | bounced | hard (the address is bad: suppressed) | bounced |
  | failed | 5.2.2 mailbox full, 5.2.3 / 5.3.4 too big, 5.6.x content, 5.7.x policy block | bounced | soft | bounced |
  | failed | 4.x.x (the reporting MTA gave up retrying, e.g. 4.4.7 expired) or none | bounced | soft | bounced |
  | delayed | any | none (the MTA still retries) | | delayed |
  | delivered | any | delivered | | delivered |
  | relayed, expanded | any | none (no further reports will come) | | relayed / expanded |

  The 5.x.x exceptions follow what SES and SendGrid do: a full mailbox, an oversized message and a
  policy block say nothing bad about the address, so they do not suppress it.
- RFC 5965 abuse reports (ARF, `report-type=feedback-report`, a `message/feedback-report` part):
  `Feedback-Type` `abuse`, `fraud`, `virus` and `other` are `complained`; `not-spam` and
  `auth-failure` (RFC 6591) are events without a receipt.

Anything else (an auto-reply, a plain-text bounce without a report part) is `NotAReport`.
Which notification a report is about is never read from the report: the VERP address it was
mailed to says so (`providers.verp`), so a report can only touch the notification whose
authenticated return path it reached.

The event id is the report's `Message-ID` (so the MTA's retry of the same report is one event);
without one, the receipt is de-duplicated by the hash of the report's bytes. `occurred_at` is the
block's `Last-Attempt-Date`, else the report's `Arrival-Date`, else its `Date`, else now.
Details carry the action, status, diagnostic text (addresses masked, bounded) and the MTAs'
names, never the recipient's address.
"""

from __future__ import annotations

import binascii
import email
import email.message
import email.parser
import quopri
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from core.masking import mask_email, mask_text
from core.validation import check_datetime_range
from receipts.inbound import Receipt

MAX_DETAIL_CHARS = 300
MAX_EVENT_ID_CHARS = 200
_STATUS = re.compile(r"\s*([245])\.(\d{1,3})\.(\d{1,3})")
_WHITESPACE = re.compile(r"\s+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BLOCK_SEPARATOR = re.compile(r"\n[ \t]*\n")
# Any address, internationalised ones (RFC 6531) included, which core.masking's ASCII pattern misses.
_ANY_ADDRESS = re.compile(r"[^\s<>@;,:()\[\]\"']+@[^\s<>@;,:()\[\]\"']+")

DSN_TYPES = ("message/delivery-status", "message/global-delivery-status")
ARF_TYPE = "message/feedback-report"
COMPLAINT_FEEDBACK = frozenset({"abuse", "fraud", "virus", "other"})
# Permanent failures that say nothing bad about the address: soft (see the table above).
_SOFT_PERMANENT = frozenset({(2, 2), (2, 3), (3, 4)})
_SOFT_SUBJECTS = frozenset({6, 7})
_RANK = {"bounced": 4, "delivered": 3, "delayed": 2, "relayed": 1, "expanded": 1}


class NotAReport(ValueError):
    """The message is neither a delivery status notification nor a feedback report."""


@dataclass(frozen=True, slots=True)
class Report:
    type: str  # the event type: bounced, delayed, delivered, relayed, expanded, complained, not_spam, ...
    receipt: str | None
    bounce_type: str | None
    occurred_at: datetime
    event_id: str  # the report's Message-ID, or "" (then the raw bytes' hash de-duplicates)
    details: dict[str, Any] = field(default_factory=dict)

    def receipt_for(self, notification_id: str, raw: bytes) -> Receipt:
        return Receipt(
            notification_id=notification_id,
            type=self.type,
            occurred_at=self.occurred_at,
            receipt=self.receipt,
            bounce_type=self.bounce_type,
            details=self.details,
            event_id=self.event_id,
            raw=raw,
        )


def classify_dsn(action: str, status: str) -> tuple[str, str | None, str | None]:
    """(event type, receipt, bounce_type) of one per-recipient block: the table above."""
    action = action.strip().lower().split(" ", 1)[0].split("(", 1)[0]
    if action == "failed":
        match = _STATUS.match(status or "")
        if match and match.group(1) == "5":
            subject, detail = int(match.group(2)), int(match.group(3))
            soft = subject in _SOFT_SUBJECTS or (subject, detail) in _SOFT_PERMANENT
            return "bounced", "bounced", "soft" if soft else "hard"
        return "bounced", "bounced", "soft"
    if action == "delivered":
        return "delivered", "delivered", None
    if action in ("delayed", "relayed", "expanded"):
        return action, None, None
    raise NotAReport(f"unknown DSN action {action[:40]!r}")


def parse_report(raw: bytes, *, now: datetime | None = None) -> Report:
    """Read one mailed report (the DATA of an SMTP transaction). Raises NotAReport."""
    now = now or datetime.now(UTC)
    message = email.message_from_bytes(raw.replace(b"\r\n", b"\n"))
    if message.get_content_type() != "multipart/report" or not message.is_multipart():
        raise NotAReport("not a multipart/report message")
    report_type = (message.get_param("report-type") or "").lower()
    parts = {part.get_content_type(): part for part in _children(message)}
    event_id = _event_id(message.get("Message-ID"))
    sent = _date(message.get("Date"), now)
    if report_type == "delivery-status" or (not report_type and any(t in parts for t in DSN_TYPES)):
        part = next((parts[t] for t in DSN_TYPES if t in parts), None)
        if part is None:
            raise NotAReport("a delivery-status report without a message/delivery-status part")
        return _dsn(_blocks(part), event_id, sent, now)
    if report_type == "feedback-report" or (not report_type and ARF_TYPE in parts):
        if ARF_TYPE not in parts:
            raise NotAReport("a feedback report without a message/feedback-report part")
        blocks = _blocks(parts[ARF_TYPE])
        if not blocks:
            raise NotAReport("an empty feedback report")
        return _arf(blocks[0], event_id, sent, now)
    raise NotAReport(f"report-type {report_type[:40]!r} is neither delivery-status nor feedback-report")


def _dsn(blocks: list[email.message.Message], event_id: str, sent: datetime | None, now: datetime) -> Report:
    if len(blocks) < 2:
        raise NotAReport("a delivery status without a per-recipient block")
    per_message, recipients = blocks[0], blocks[1:]
    chosen: tuple[int, email.message.Message, tuple[str, str | None, str | None]] | None = None
    for block in recipients:
        action = block.get("Action")
        if not action:
            continue
        outcome = classify_dsn(str(action), str(block.get("Status") or ""))
        rank = _RANK[outcome[0]] * 2 + (outcome[2] == "hard")
        if chosen is None or rank > chosen[0]:
            chosen = (rank, block, outcome)
    if chosen is None:
        raise NotAReport("no per-recipient block has an Action")
    _, block, (event_type, receipt, bounce_type) = chosen
    occurred = (
        _date(block.get("Last-Attempt-Date"), now) or _date(per_message.get("Arrival-Date"), now) or sent or now
    )
    details = _clean(
        {
            "source": "dsn",
            "action": str(block.get("Action")).strip().lower(),
            "status": _status_code(block.get("Status")),
            "diagnostic_code": block.get("Diagnostic-Code"),
            "reporting_mta": per_message.get("Reporting-MTA"),
            "remote_mta": block.get("Remote-MTA"),
        }
    )
    return Report(event_type, receipt, bounce_type, occurred, event_id, details)


def _arf(fields: email.message.Message, event_id: str, sent: datetime | None, now: datetime) -> Report:
    feedback = _WHITESPACE.sub("", str(fields.get("Feedback-Type") or "")).lower()
    if not feedback:
        raise NotAReport("a feedback report without a Feedback-Type")
    occurred = _date(fields.get("Arrival-Date") or fields.get("Received-Date"), now) or sent or now
    details = _clean(
        {
            "source": "arf",
            "feedback_type": feedback,
            "user_agent": fields.get("User-Agent"),
            "reported_domain": fields.get("Reported-Domain"),
        }
    )
    if feedback in COMPLAINT_FEEDBACK:
        return Report("complained", "complained", None, occurred, event_id, details)
    return Report(feedback.replace("-", "_")[:40], None, None, occurred, event_id, details)


def _children(message: email.message.Message) -> Iterable[email.message.Message]:
    payload = message.get_payload()
    return [p for p in payload if isinstance(p, email.message.Message)] if isinstance(payload, list) else []


def _blocks(part: email.message.Message) -> list[email.message.Message]:
    """The header blocks of a delivery-status or feedback-report part. The standard parser splits
    `message/delivery-status` into blocks itself; other types (the global DSN, ARF) and parts sent
    with a transfer encoding are split here."""
    payload = part.get_payload()
    encoding = str(part.get("Content-Transfer-Encoding") or "").strip().lower()
    encoded = encoding in ("base64", "quoted-printable")
    if part.get_content_type() == "message/delivery-status" and isinstance(payload, list) and not encoded:
        return [p for p in payload if isinstance(p, email.message.Message)]
    if isinstance(payload, list):  # message/*: parsed as one message whose headers are the first block
        # as_bytes restores 8-bit header bytes (RFC 6533's UTF-8 fields), which as_string garbles
        data = b"\n".join(p.as_bytes() for p in payload if isinstance(p, email.message.Message))
        if encoded:  # a transfer encoding the parser did not undo for a message/* part
            data = binascii.a2b_base64(data) if encoding == "base64" else quopri.decodestring(data)
        text = data.decode("utf-8", "replace")
    else:
        data = part.get_payload(decode=True)
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(payload or "")
    parser = email.parser.HeaderParser()
    blocks = []
    for chunk in _BLOCK_SEPARATOR.split(text.replace("\r\n", "\n").strip("\n")):
        if chunk.strip():
            blocks.append(parser.parsestr(chunk.strip("\n") + "\n"))
    return blocks


def _status_code(value: object) -> str:
    match = _STATUS.match(str(value or ""))
    return match.group(0).strip() if match else ""


def _date(value: object, now: datetime) -> datetime | None:
    if not value:
        return None
    try:
        when = parsedate_to_datetime(_WHITESPACE.sub(" ", str(value)).strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:  # a mail has no field to name in a 400: a date OmniPost cannot store is no date
        when = check_datetime_range(when)
    except ValueError:
        return None
    if when > now + timedelta(days=1):  # a clock far ahead, or nonsense: the arrival is the better guess
        return None
    return when


def _event_id(value: object) -> str:
    text = _CONTROL.sub("", _WHITESPACE.sub("", str(value or ""))).strip("<>")
    return text if 0 < len(text) <= MAX_EVENT_ID_CHARS else ""


def _clean(details: dict[str, Any]) -> dict[str, Any]:
    """Header values unfolded, addresses masked, bounded; empty ones left out."""
    out = {}
    for key, value in details.items():
        if not value:
            continue
        text = _CONTROL.sub("", _WHITESPACE.sub(" ", str(value))).strip()
        text = _ANY_ADDRESS.sub(lambda m: mask_email(m.group(0)), mask_text(text))
        out[key] = text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"
    return out
