"""Emitting events: in the transaction of what caused them, one statement per batch.

Two ways in, one SQL shape (`events.statements.insert_events_ctes`; every statement that writes
this app's tables is in events.statements): the events of a source CTE are inserted into `events`,
marked `fanout_pending` — an outbox: one row per event in the statement that caused it. The
event lane's claim (events.deliveries) later fans each out to `event_deliveries`, one row per
endpoint of the tenant enabled and subscribed to the type then (`event_types` holds the type or
"*"). An event is written when the tenant has an endpoint subscribed to
its type, enabled or not: a disabled endpoint gets no delivery, but `recover` sends it the events
made while it was disabled.

- `statements.outcome_batch_cte(source)`: a CTE that the dispatcher's record statement (dispatch.delivery)
  appends to its chain: the notifications that became delivered / failed / dead_lettered go, as
  facts in arrays, into one `event_outcome_batches` row per statement (an outbox of the outbox:
  with an endpoint for every type, a row per event made the record statement cost about 15 % of
  the dispatcher's rate; the arrays cost a few). A one-time gate (is there an endpoint at all?) and
  a hashed semi-join on the endpoints' tenants keep tenants without endpoints at ~nothing. The
  event lane's claim opens the batches into `notification.*` events (`statements.open_outcomes_ctes`).
- `emit(cursor, tenant_id, type, rows)`: for other callers (suppressions; anything with its data).
- `emit_notification_events(cursor, items)`: events about notifications named by id, their data
  read from the notification in the same statement (receipts: notification.bounced / complained).

Payloads hold `recipient_masked`, never a recipient: `{"type", "timestamp", "data": {...}}`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connection

from events import statements
from events.models import ALL_TYPES, EventType

NOTIFICATION_FIELDS = (
    "notification_id", "status", "receipt", "bounce_type", "channel", "recipient_masked", "provider",
    "attempt_count", "error_code",
)  # fmt: skip
SUPPRESSION_FIELDS = (
    "suppression_id", "recipient_masked", "channel", "reason", "category", "source_notification_id",
)  # fmt: skip


def emit(cursor: Any, tenant_id: uuid.UUID | str, type: str, rows: Iterable[Mapping[str, Any]]) -> list[str]:  # noqa: A002, ANN401
    """Emit events of one `type` for one tenant, in ONE statement, and return their public ids
    (`evt_…`, the `webhook-id` each will carry).

    - `cursor`: a cursor of the connection whose transaction caused the events (a Django cursor
      or a psycopg one), or None for `django.db.connection.cursor()`. Call it inside the caller's
      transaction so the events commit (or roll back) with what caused them.
    - `tenant_id`: the tenant's UUID.
    - `type`: an `events.models.EventType` value, e.g. "notification.bounced",
      "notification.complained", "recipient.suppressed".
    - `rows`: one mapping per event, the `data` of its payload. `notification.*` events take the
      keys of NOTIFICATION_FIELDS (notification_id, status, receipt, bounce_type, channel,
      recipient_masked, provider, attempt_count, error_code); `recipient.suppressed` those of
      SUPPRESSION_FIELDS (suppression_id, recipient_masked, channel, reason, category,
      source_notification_id). Missing keys are null; any other key (a plaintext `recipient`, say)
      is a ValueError, except `test`: test data's events say `"test": true`. UUIDs and datetimes are
      written as strings.

    Nothing is written when the tenant has no endpoint subscribed to `type` (returns []); an event
    gets a delivery per enabled endpoint subscribed to it when the event lane claims it.
    """
    if type not in EventType.values:
        raise ValueError(f"unknown event type {type!r}; expected one of {', '.join(EventType.values)}")
    allowed = SUPPRESSION_FIELDS if type == EventType.SUPPRESSED else NOTIFICATION_FIELDS
    data = []
    for row in rows:
        unknown = sorted(set(row) - set(allowed) - {"test"})
        if unknown:
            raise ValueError(f"unknown event data key(s) {unknown} for {type}; allowed: {', '.join(allowed)}")
        item = {name: row.get(name) for name in allowed}
        if row.get("test"):
            item["test"] = True
        data.append(item)
    if not data:
        return []
    document = json.dumps(data, default=str)
    params = {"tenant": str(tenant_id), "type": type, "rows": document}
    if cursor is None:
        with connection.cursor() as own:
            own.execute(statements.EMIT, params)
            return [r[0] for r in own.fetchall()]
    cursor.execute(statements.EMIT, params)
    return [r[0] for r in cursor.fetchall()]


def emit_notification_events(
    cursor: Any, items: Iterable[tuple[uuid.UUID | str, str, Mapping[str, Any]]]  # noqa: ANN401
) -> list[str]:
    """Emit events about notifications, in ONE statement; returns their public ids.

    - `cursor`: as for `emit` (the caller's transaction; None: Django's connection).
    - `items`: (notification_id, type, extra) per event; `type` an EventType value (e.g.
      "notification.bounced", "notification.complained"); `extra` may give `receipt` and
      `bounce_type`. The rest of the data (status, channel, recipient_masked, provider,
      attempt_count, error_code) and the tenant are read from the notification as it is now.

    An event is written only where the notification's tenant has an endpoint subscribed to its
    type; an unknown notification id writes nothing. The receipts' `after_apply` seam calls this
    with its changed rows: `[(row.notification_id, "notification.bounced", {"receipt": row.receipt,
    "bounce_type": row.bounce_type}), ...]`.
    """
    wanted = []
    for notification_id, type_, extra in items:
        if type_ not in EventType.values or type_ == EventType.SUPPRESSED:
            raise ValueError(f"{type_!r} is not a notification event type")
        unknown = sorted(set(extra) - {"receipt", "bounce_type"})
        if unknown:
            raise ValueError(f"unknown extra key(s) {unknown}; allowed: receipt, bounce_type")
        wanted.append({"notification_id": str(notification_id), "type": type_, "receipt": extra.get("receipt"),
                       "bounce_type": extra.get("bounce_type")})  # fmt: skip
    if not wanted:
        return []
    params = {"items": json.dumps(wanted)}
    if cursor is None:
        with connection.cursor() as own:
            own.execute(statements.NOTIFICATION_EVENTS, params)
            return [r[0] for r in own.fetchall()]
    cursor.execute(statements.NOTIFICATION_EVENTS, params)
    return [r[0] for r in cursor.fetchall()]


__all__ = ["ALL_TYPES", "NOTIFICATION_FIELDS", "SUPPRESSION_FIELDS", "emit", "emit_notification_events"]


def emit_suppressed(entries: Iterable[Any]) -> None:  # noqa: ANN401
    """`recipient.suppressed` for suppression entries just created (the `recipients.suppressions.
    on_suppressed` callback): one statement per tenant among them (a receipt batch or an API call is
    one tenant's)."""
    by_tenant: dict[Any, list[dict[str, Any]]] = {}
    for entry in entries:
        by_tenant.setdefault(entry.tenant_id, []).append({
            "suppression_id": entry.id, "recipient_masked": entry.recipient_masked, "channel": entry.channel,
            "reason": entry.reason, "category": entry.category,
            "source_notification_id": entry.source_notification_id, "test": getattr(entry, "test", False),
        })  # fmt: skip
    for tenant_id, rows in by_tenant.items():
        emit(None, tenant_id, EventType.SUPPRESSED, rows)
