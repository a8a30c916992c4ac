"""A notification's receipt events as its API detail shows them (registered with notifications.reads:
the function, and the same read as a LATERAL subquery the detail statement joins)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from core import hot_sql
from core.validation import EARLIEST_DATETIME, END_OF_DATETIMES
from notifications.models import Notification
from notifications.reads import ReceiptEventsLateral

# One row of arrays (notif_event_notification_idx) for the notification row `n`: the detail read is on
# the API's hot path, where compiling an ORM query would cost more than running it. `occurred_at` is
# read within core.validation's date-time range: a row stored before receipts were held to it (year 0
# in UTC, from "0001-01-01T00:00:00+14:00") cannot be read by psycopg, and made the detail 500 for ever.
_RECEIPT_EVENTS_OF_N = """
    SELECT array_agg(e.type ORDER BY e.occurred_at, e.id),
           array_agg(least(greatest(e.occurred_at, '{EARLIEST}'::timestamptz), '{LATEST}'::timestamptz)
                     ORDER BY e.occurred_at, e.id),
           array_agg(coalesce(p.name, '') ORDER BY e.occurred_at, e.id),
           array_agg(e.details ORDER BY e.occurred_at, e.id)
    FROM notification_events e LEFT JOIN providers p ON p.id = e.provider_id
    WHERE e.notification_id = n.id AND e.tenant_id = n.tenant_id""".replace(
    "{EARLIEST}", EARLIEST_DATETIME.isoformat()
).replace("{LATEST}", (END_OF_DATETIMES - timedelta(microseconds=1)).isoformat())
_RECEIPT_EVENTS_SQL = (
    f"SELECT ev.* FROM (SELECT %s::uuid AS id, %s::uuid AS tenant_id) n, LATERAL ({_RECEIPT_EVENTS_OF_N}) ev"  # noqa: S608
)


def _parse(values: Sequence[Any]) -> list[dict[str, Any]]:
    types, times, names, details = values
    if not types:
        return []
    return [
        {"type": t, "occurred_at": at, "provider": name, "details": (json.loads(d) if isinstance(d, str) else d) or {}}
        for t, at, name, d in zip(types, times, names, details, strict=True)
    ]


RECEIPT_EVENTS_LATERAL = ReceiptEventsLateral(sql=_RECEIPT_EVENTS_OF_N, columns=4, parse=_parse)


def receipt_events_of(n: Notification) -> list[dict[str, Any]]:
    """{type, occurred_at, provider (name), details}, oldest first: one statement."""
    return _parse(hot_sql.fetchone(_RECEIPT_EVENTS_SQL, [n.pk, n.tenant_id]))
