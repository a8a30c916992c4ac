"""What follows an applied receipt, in the apply's transaction (an `AFTER_APPLY` hook, receipts.apps).

- A hard bounce or a complaint suppresses the address on its channel (email and SMS only),
  for every category (`category` null), naming the notification as its source
  (`notifications.addresses.suppress_notifications`: two statements per batch; its `on_suppressed`
  callbacks emit `recipient.suppressed`).
- Each changed receipt becomes an event for the tenant's endpoints, in one statement
  (`events.emit.emit_notification_events`): `bounced` → `notification.bounced`, `complained` →
  `notification.complained`, `undelivered` and `failed` → `notification.failed` (its data says
  `status: delivered` with the `receipt`, so a consumer tells a provider's refusal from a later
  failure). A `delivered` receipt makes no event: `notification.delivered` was sent when the provider
  accepted the message.
"""

from __future__ import annotations

from events.emit import emit_notification_events
from notifications.addresses import suppress_notifications
from receipts.inbound import ProviderView
from receipts.services import ApplyResult

RECEIPT_EVENTS = {
    "bounced": "notification.bounced",
    "complained": "notification.complained",
    "undelivered": "notification.failed",
    "failed": "notification.failed",
}
SUPPRESSING = {("bounced", "hard"): "hard_bounce", ("complained", None): "complaint"}
ADDRESS_CHANNELS = ("email", "sms")


def suppressing_reason(receipt: str, bounce_type: str | None) -> str | None:
    return SUPPRESSING.get((receipt, bounce_type if receipt == "bounced" else None))


def follow_up(provider: ProviderView, result: ApplyResult) -> None:
    reasons = {
        row.notification_id: reason
        for row in result.changed
        if row.channel in ADDRESS_CHANNELS and (reason := suppressing_reason(row.receipt, row.bounce_type))
    }
    if reasons:  # the changed rows are the provider's tenant's own (apply_receipts checked)
        suppress_notifications(reasons)
    items = [
        (row.notification_id, RECEIPT_EVENTS[row.receipt], {"receipt": row.receipt, "bounce_type": row.bounce_type})
        for row in result.changed
        if row.receipt in RECEIPT_EVENTS
    ]
    if items:
        emit_notification_events(None, items)


follow_up.receipts = frozenset(RECEIPT_EVENTS)  # a batch of `delivered` receipts needs no follow-up
