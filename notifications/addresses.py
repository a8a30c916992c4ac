"""What happens to a stored notification's address after the send: a hard bounce or a complaint
puts it on the tenant's suppression list (receipts' follow-ups call `suppress_notifications`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from core import crypto
from notifications.models import Notification
from recipients.models import Suppression
from recipients.suppressions import Entry, suppress_many


def _uuid(value: Any) -> uuid.UUID:  # noqa: ANN401
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def suppress_notifications(
    reasons: dict[Any, str] | Sequence[tuple[Any, str]], *, actor: str | None = None
) -> list[Suppression]:
    """Suppress the addresses of notifications, by id → reason (what a batch of receipts does: a hard
    bounce or a complaint suppresses its notification's address for every category, with the
    notification as the source). Two statements whatever the batch's size (read the notifications,
    insert the entries); ids of no notification are skipped, and so are channels other than email and
    SMS (recipients.suppressions.ADDRESS_REASONS). Returns the entries created now."""
    wanted = {_uuid(k): v for k, v in (reasons.items() if isinstance(reasons, dict) else reasons)}
    if not wanted:
        return []
    rows = list(Notification.objects.filter(pk__in=list(wanted))
                .values_list("id", "tenant_id", "channel", "test", "recipient"))  # fmt: skip
    opened = crypto.decrypt_many([token for *_, token in rows])
    entries = []
    for (pk, tenant_id, channel, test, token), address in zip(rows, opened, strict=True):
        if address is None:
            address = crypto.decrypt(token, where=f"Notification.recipient of row {pk}")
        # a test notification's bounce suppresses within the test data only
        entries.append(Entry(tenant_id, channel, address, wanted[pk], None, pk, test))
    return suppress_many(entries, actor=actor)
