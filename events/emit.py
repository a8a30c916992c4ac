"""Emitting events: in the transaction of what caused them, one statement per batch.

Two ways in, one SQL shape (`_insert_ctes`): the events of a source CTE are inserted into `events`,
marked `fanout_pending` — an outbox: one row per event in the statement that caused it. The
event lane's claim (events.deliveries) later fans each out to `event_deliveries`, one row per
endpoint of the tenant enabled and subscribed to the type then (`event_types` holds the type or
"*"). An event is written when the tenant has an endpoint subscribed to
its type, enabled or not: a disabled endpoint gets no delivery, but `recover` sends it the events
made while it was disabled.

- `outcome_batch_cte(source)`: a CTE that the dispatcher's record statement (dispatch.delivery)
  appends to its chain: the notifications that became delivered / failed / dead_lettered go, as
  facts in arrays, into one `event_outcome_batches` row per statement (an outbox of the outbox:
  with an endpoint for every type, a row per event made the record statement cost about 15 % of
  the dispatcher's rate; the arrays cost a few). A one-time gate (is there an endpoint at all?) and
  a hashed semi-join on the endpoints' tenants keep tenants without endpoints at ~nothing. The
  event lane's claim opens the batches into `notification.*` events (`open_outcomes_ctes`).
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

from events.models import ALL_TYPES, EventType

NOTIFICATION_FIELDS = (
    "notification_id", "status", "receipt", "bounce_type", "channel", "recipient_masked", "provider",
    "attempt_count", "error_code",
)  # fmt: skip
SUPPRESSION_FIELDS = (
    "suppression_id", "recipient_masked", "channel", "reason", "category", "source_notification_id",
)  # fmt: skip


def _rfc3339(at: str) -> str:
    """SQL: the timestamptz `at` as RFC 3339 text in UTC with microseconds (a payload's `timestamp`)."""
    return f"""to_char({at} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def _notification_data(n: str, *, status: str, receipt: str, bounce_type: str, provider_id: str, attempt_count: str,
                       error_code: str) -> str:  # fmt: skip
    """SQL: a `notification.*` event's data (NOTIFICATION_FIELDS) for the notification row `n`
    (its id, channel and recipient_masked), the other fields given as SQL expressions."""
    return f"""jsonb_build_object(
        'notification_id', {n}.id, 'status', {status}, 'receipt', {receipt}, 'bounce_type', {bounce_type},
        'channel', {n}.channel, 'recipient_masked', {n}.recipient_masked,
        'provider', (SELECT p.name FROM providers p WHERE p.id = {provider_id}),
        'attempt_count', {attempt_count}, 'error_code', nullif({error_code}, ''))"""  # noqa: S608 - callers' SQL


# Time-ordered ids (shown as evt_<hex>, events.models.public_event_id): the statement's millisecond
# (computed once) then random digits, so a batch's events sit side by side in the primary key and
# the lane's lookups of them, in creation order, touch few pages (random UUIDs cost it a page each).
_EVENT_ID_SQL = (
    "(lpad(to_hex((SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)), 12, '0')"
    " || substr(md5(random()::text), 1, 20))::uuid"
)
_SUBSCRIBED = "(e.event_types ? {type} OR e.event_types ? '*')"


def _insert_ctes(source: str, prefix: str, *, at: str = "now()") -> str:
    """`{prefix}_new` inserts the events of `source` (columns tenant_id, type, data), made `at` (an
    SQL expression over `s`, the source's row; default the statement's now()), marked
    `fanout_pending`: the event lane's claim makes their deliveries (events.deliveries). The caller
    has already filtered `source` to tenants with a subscribed endpoint."""
    return f"""{prefix}_new AS (
        INSERT INTO events (id, tenant_id, type, payload, created_at, fanout_pending)
        SELECT {_EVENT_ID_SQL}, s.tenant_id, s.type,
               jsonb_build_object('type', s.type, 'timestamp', {_rfc3339(at)}, 'data', s.data), {at}, true
        FROM {source} s
        RETURNING id, tenant_id, type
    )"""  # noqa: S608 - this module's fragments and the caller's CTE names only; values are parameters


def outcome_batch_cte(source: str, *, prefix: str = "ob") -> str:
    """CTEs (comma-separated, no leading comma) to append to a WITH chain in which `source` is a
    CTE of updated notifications with the columns notification_id, tenant_id, provider_id,
    attempt_count, error_code and status (the new status). Its rows whose status is delivered,
    failed or dead_lettered, of tenants with an event endpoint, go into ONE `event_outcome_batches`
    row (the outbox, facts in parallel arrays): no row, index entry or JSON per event here. The
    event lane opens it into events (`open_outcomes_ctes`), for the endpoints subscribed to each
    type. Adds no statement: the batch is written by the statement that records the outcomes, in
    its transaction. `{prefix}_new` returns the row's size (`n`)."""
    return f"""{prefix}_new AS (
        INSERT INTO event_outcome_batches (tenant_ids, notification_ids, statuses, attempt_counts, provider_ids,
                                           error_codes)
        SELECT array_agg(c.tenant_id), array_agg(c.notification_id), array_agg(c.status::text),
               array_agg(c.attempt_count), array_agg(c.provider_id), array_agg(c.error_code::text)
        FROM {source} c
        WHERE c.status IN ('delivered', 'failed', 'dead_lettered')
          -- a one-time gate: with no endpoint anywhere, nothing below runs per row
          AND EXISTS (SELECT FROM event_endpoints)
          AND c.tenant_id IN (SELECT e.tenant_id FROM event_endpoints e)
        HAVING count(*) > 0
        RETURNING cardinality(notification_ids) AS n
    )"""  # noqa: S608 - constant fragments and CTE names


def open_outcomes_ctes(batches: str, *, prefix: str = "oc") -> str:
    """CTEs that turn the `event_outcome_batches` rows of `batches` (a CTE of deleted rows, all
    columns) into events marked `fanout_pending`, of the types the tenant's endpoints subscribe to
    (enabled or not, as `emit`): `notification.<status>` with the data of NOTIFICATION_FIELDS, the
    channel and recipient_masked read from the notification, the provider's name from its row, the
    `timestamp` the batch's. `{prefix}_new` returns each event's id."""
    subscribed = _SUBSCRIBED.format(type="('notification.' || u.status)")
    data = _notification_data("n", status="u.status", receipt="NULL", bounce_type="NULL", provider_id="u.provider_id",
                              attempt_count="u.attempt_count", error_code="u.error_code")  # fmt: skip
    return f"""{prefix}_src AS (
        SELECT u.tenant_id, 'notification.' || u.status AS type, {data} AS data, b.created_at AS at
        FROM {batches} b,
             unnest(b.tenant_ids, b.notification_ids, b.statuses, b.attempt_counts, b.provider_ids, b.error_codes)
                 AS u(tenant_id, notification_id, status, attempt_count, provider_id, error_code)
        JOIN notifications n ON n.id = u.notification_id
        WHERE EXISTS (SELECT FROM event_endpoints e WHERE e.tenant_id = u.tenant_id AND {subscribed})
    ), {_insert_ctes(f"{prefix}_src", prefix, at="s.at")}"""  # noqa: S608 - constant fragments and CTE names


_EMIT_SUBSCRIBED = _SUBSCRIBED.format(type="%(type)s::text")
_EMIT_SQL = f"""
    WITH emit_src AS (
        SELECT %(tenant)s::uuid AS tenant_id, %(type)s::text AS type, r.data
        FROM jsonb_array_elements(%(rows)s::jsonb) AS r(data)
        WHERE EXISTS (SELECT FROM event_endpoints e
                      WHERE e.tenant_id = %(tenant)s::uuid AND {_EMIT_SUBSCRIBED})
    ), {_insert_ctes("emit_src", "emit")}
    SELECT 'evt_' || replace(id::text, '-', '') FROM emit_new
"""  # noqa: S608 - constant fragments only; values are bound parameters


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
      is a ValueError. UUIDs and datetimes are written as strings.

    Nothing is written when the tenant has no endpoint subscribed to `type` (returns []); an event
    gets a delivery per enabled endpoint subscribed to it when the event lane claims it.
    """
    if type not in EventType.values:
        raise ValueError(f"unknown event type {type!r}; expected one of {', '.join(EventType.values)}")
    allowed = SUPPRESSION_FIELDS if type == EventType.SUPPRESSED else NOTIFICATION_FIELDS
    data = []
    for row in rows:
        unknown = sorted(set(row) - set(allowed))
        if unknown:
            raise ValueError(f"unknown event data key(s) {unknown} for {type}; allowed: {', '.join(allowed)}")
        data.append({name: row.get(name) for name in allowed})
    if not data:
        return []
    document = json.dumps(data, default=str)
    params = {"tenant": str(tenant_id), "type": type, "rows": document}
    if cursor is None:
        with connection.cursor() as own:
            own.execute(_EMIT_SQL, params)
            return [r[0] for r in own.fetchall()]
    cursor.execute(_EMIT_SQL, params)
    return [r[0] for r in cursor.fetchall()]


_NOTIFICATION_EVENTS_SQL = f"""
    WITH wanted AS (
        SELECT (r.item->>'notification_id')::uuid AS notification_id, r.item->>'type' AS type,
               r.item->>'receipt' AS receipt, r.item->>'bounce_type' AS bounce_type
        FROM jsonb_array_elements(%(items)s::jsonb) AS r(item)
    ), notification_src AS (
        SELECT n.tenant_id, w.type,
               {_notification_data("n", status="n.status", receipt="w.receipt", bounce_type="w.bounce_type",
                                   provider_id="n.provider_id", attempt_count="n.attempt_count",
                                   error_code="n.last_error_code")} AS data
        FROM wanted w
        JOIN notifications n ON n.id = w.notification_id
        WHERE EXISTS (SELECT FROM event_endpoints e
                      WHERE e.tenant_id = n.tenant_id AND {_SUBSCRIBED.format(type="w.type")})
    ), {_insert_ctes("notification_src", "notification")}
    SELECT 'evt_' || replace(id::text, '-', '') FROM notification_new
"""  # noqa: S608 - constant fragments only; values are bound parameters


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
            own.execute(_NOTIFICATION_EVENTS_SQL, params)
            return [r[0] for r in own.fetchall()]
    cursor.execute(_NOTIFICATION_EVENTS_SQL, params)
    return [r[0] for r in cursor.fetchall()]


__all__ = [
    "ALL_TYPES", "NOTIFICATION_FIELDS", "SUPPRESSION_FIELDS", "emit", "emit_notification_events",
    "open_outcomes_ctes", "outcome_batch_cte",
]  # fmt: skip


def emit_suppressed(entries: Iterable[Any]) -> None:  # noqa: ANN401
    """`recipient.suppressed` for suppression entries just created (the `recipients.suppressions.
    on_suppressed` callback): one statement per tenant among them (a receipt batch or an API call is
    one tenant's)."""
    by_tenant: dict[Any, list[dict[str, Any]]] = {}
    for entry in entries:
        by_tenant.setdefault(entry.tenant_id, []).append({
            "suppression_id": entry.id, "recipient_masked": entry.recipient_masked, "channel": entry.channel,
            "reason": entry.reason, "category": entry.category,
            "source_notification_id": entry.source_notification_id,
        })  # fmt: skip
    for tenant_id, rows in by_tenant.items():
        emit(None, tenant_id, EventType.SUPPRESSED, rows)
