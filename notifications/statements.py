"""The SQL that writes this app's tables (notifications, delivery_attempts, idempotency_records,
tenant_queues, provider_messages, and the sequences'), in one place: functions and fragments that the statements of
other modules and apps compose (the dispatcher's record statement, prune's batch, the receipts
statement, the dead-letter redrive), so a change to how a notification's row moves is made here
and nowhere else (tests/test_table_owners.py); beside its write, the one read of
provider_messages that the receipts statement composes. Values are always bound parameters; the arguments
of these functions are the caller's CTE names and fixed fragments.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from django.db import connections
from django.db.models import JSONField

from core.fields import EncryptedTextField
from core.plain_json import plain_json
from notifications.models import Notification

# An Idempotency-Key's record, written with what it replays. The advisory lock (held until the
# statement's transaction ends) tells a request whose twin is being stored right now (409) from
# one that finds the record stored (replay or 422), instead of waiting on the unique index.
IDEMPOTENCY_RECORD = """record AS (
    INSERT INTO idempotency_records (tenant_id, key, fingerprint, state, response_status, response_body,
                                     created_at, expires_at)
    SELECT %s, %s, %s, 'completed', %s, %s, %s::timestamptz, %s::timestamptz FROM gate
    WHERE version_ok AND key_free AND check_ok
    ON CONFLICT ON CONSTRAINT idempotency_key_unique_per_tenant DO UPDATE
        SET fingerprint = EXCLUDED.fingerprint, state = EXCLUDED.state, response_status = EXCLUDED.response_status,
            response_body = EXCLUDED.response_body, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
        WHERE idempotency_records.expires_at <= EXCLUDED.created_at
           OR (idempotency_records.state = 'in_flight' AND idempotency_records.created_at < %s::timestamptz)
    RETURNING 1)"""
# A create's queue names the tenant has not used before (notifications.services).
NEW_QUEUES = """new_queues AS (
    INSERT INTO tenant_queues (tenant_id, name, created_at)
    SELECT %s, unnest(%s::text[]), %s::timestamptz FROM gate WHERE version_ok AND key_free AND check_ok
    ON CONFLICT DO NOTHING)"""

# A dead-lettered (or failed) notification goes back to `queued` with a fresh attempt budget
# (attempt_offset), for the dead-letter redrive (dlq.services): only if it is still failed or
# dead-lettered; returns what its new queue item needs.
REQUEUE_DEAD_LETTERED = """
UPDATE notifications n
SET status = 'queued', attempt_offset = n.attempt_count, last_error_code = '', enqueued_at = now(),
    updated_at = now()
WHERE n.id = ANY(%s::uuid[]) AND n.status IN ('failed', 'dead_lettered')
RETURNING n.id, n.tenant_id, n.provider_id, n.queue, n.priority, n.channel
"""


def record_outcomes_sql(ours: str, returning: str) -> str:
    """The body of the record statement's `changed` CTE (dispatch.delivery): the notifications of
    the items in `ours` (a CTE with notification_id, status, attempts, code; an empty status leaves
    the row as it is) take their new status, attempt count and error code, if still live. Returns
    the due → now seconds (for the latency histogram), the new status and the columns the event
    outbox reads, then `returning` (e.g. notifications.fallback.RETURNING)."""
    return f"""
        UPDATE notifications n
        SET status = k.status,
            attempt_count = CASE WHEN k.attempts >= 0 THEN k.attempts ELSE n.attempt_count END,
            last_error_code = k.code,
            delivered_at = CASE WHEN k.status = 'delivered' THEN now() ELSE n.delivered_at END,
            enqueued_at = CASE WHEN k.status = 'retrying' THEN now() ELSE n.enqueued_at END,
            updated_at = now()
        FROM {ours} k
        WHERE n.id = k.notification_id AND n.status IN ('queued', 'retrying', 'dispatching') AND k.status <> ''
        -- due (created, or scheduled_for) → delivered_at, for the latency histogram
        RETURNING extract(epoch FROM now() - greatest(n.created_at, n.scheduled_for))::float8 AS seconds,
                  k.status, n.id AS notification_id, n.tenant_id, n.channel, n.provider_id, n.recipient_masked,
                  n.attempt_count, k.code AS error_code, {returning}"""  # noqa: S608 - the caller's CTE names


def insert_attempts_sql(ours: str) -> str:
    """The body of the record statement's `attempts` CTE: one delivery attempt per row of `ours`
    that has one (a_number not null), through the provider it went through; returns each attempt's
    notification_id, provider_id, outcome, http_status and error_class (for the counters and the breakers)."""
    return f"""
        INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at, finished_at,
                                       outcome, error_class, error_code, error_message, http_status, duration_ms)
        SELECT a.tenant_id, a.notification_id, a.a_number, coalesce(a.a_provider, a.provider_id), a.a_started,
               a.a_finished, a.a_outcome, a.a_class, a.a_code, a.a_message, a.a_status, a.a_duration
        FROM {ours} a WHERE a.a_number IS NOT NULL
        RETURNING notification_id, provider_id, outcome, http_status, error_class"""  # noqa: S608 - the caller's CTE names


def insert_provider_messages_sql(ours: str) -> str:
    """The body of the record statement's `messages` CTE: (provider, message id) → notification for
    each row of `ours` whose send returned the provider's message id (a_message_id not null; never a
    webhook's), through the provider it went through. A redelivered message id keeps its first row."""
    return f"""
        INSERT INTO provider_messages (provider_id, message_id, notification_id, created_at)
        SELECT coalesce(m.a_provider, m.provider_id), m.a_message_id, m.notification_id, statement_timestamp()
        FROM {ours} m WHERE m.a_message_id IS NOT NULL
        ON CONFLICT DO NOTHING"""  # noqa: S608 - the caller's CTE names


def provider_message_sql(provider: str, message_id: str) -> str:
    """A scalar subquery: the notification whose send through `provider` returned the message id
    `message_id` (SQL expressions of the caller's), NULL if none (receipts.services)."""
    return (
        f"(SELECT pm.notification_id FROM provider_messages pm "  # noqa: S608 - the caller's expressions
        f"WHERE pm.provider_id = {provider} AND pm.message_id = {message_id})"
    )


def queue_due_sql(decided: str) -> str:
    """The body of the scheduler's promotion's `queued` CTE (notifications.promotion): the live rows
    of `decided` (notification_id, live, run_at) move `scheduled → queued`; returns what their queue
    items need, and the job's run_at."""
    return f"""    UPDATE notifications n
    SET status = 'queued', enqueued_at = now(), updated_at = now()
    FROM {decided} d
    WHERE n.id = d.notification_id AND d.live
    RETURNING n.id, n.tenant_id, n.provider_id, n.queue, n.priority, n.channel, d.run_at"""  # noqa: S608


def settle_fallbacks_sql(due: str, jobs: str, unqueued: str) -> str:
    """`UPDATE … RETURNING 1` of channel fallbacks (notifications.fallback): each of `due`
    (notification_id, cancel) is cancelled or given its job's run_at (`jobs`: notification_id,
    run_at) as `scheduled_for`, while still `scheduled`, or once queued if it left the queue
    (`unqueued`: notification_id)."""
    return f"""UPDATE notifications f
        SET status = CASE WHEN d.cancel THEN 'cancelled' ELSE f.status END,
            scheduled_for = CASE WHEN d.cancel THEN f.scheduled_for ELSE coalesce(j.run_at, f.scheduled_for) END,
            updated_at = now()
        FROM {due} d LEFT JOIN {jobs} j ON j.notification_id = d.notification_id
        WHERE f.id = d.notification_id
          AND (f.status = 'scheduled'
               OR (f.status IN ('queued', 'retrying') AND f.id IN (SELECT notification_id FROM {unqueued})))
        RETURNING 1"""  # noqa: S608 - the caller's CTE names


def delete_attempts_sql(ids: str, finished_before: str) -> str:
    """`DELETE … RETURNING outcome, provider_id` of the attempts of the notifications whose ids `ids`
    (an SQL uuid[]) holds that finished before `finished_before` (an SQL timestamptz: on the
    partitioned table only the partitions up to it are probed); for prune (operations.retention)."""
    return f"""DELETE FROM delivery_attempts WHERE notification_id = ANY({ids})
      AND finished_at < {finished_before}
    RETURNING outcome, provider_id"""  # noqa: S608 - the caller's expressions


def delete_notifications_sql(ids: str) -> str:
    """`DELETE … RETURNING created_at` of the notifications whose ids `ids` (an SQL uuid[]) holds;
    for prune (operations.retention), which deletes what hangs off them in the same statement."""
    return f"DELETE FROM notifications WHERE id = ANY({ids}) RETURNING created_at"  # noqa: S608



def raise_receipts_sql(best: str, locked: str, order: str, returning: str) -> str:
    """The body of the receipts statement's `changed` CTE (receipts.services): each notification of
    `best` (notification_id, receipt, bounce_type, rank), locked by `locked` (id), takes the receipt
    if it outranks what the row shows; `order` is the ranks' SQL text[] literal, lowest first
    (`{delivered,…}`), `returning` the caller's extra columns (notifications.fallback.RETURNING)."""
    return f"""
    UPDATE notifications n
    SET receipt = b.receipt, bounce_type = b.bounce_type, updated_at = statement_timestamp()
    FROM {best} b JOIN {locked} l ON l.id = b.notification_id
    WHERE n.id = l.id
      AND coalesce(array_position('{order}'::text[], n.receipt || coalesce(':' || n.bounce_type, '')), 0) < b.rank
    RETURNING n.id, n.tenant_id, n.receipt, n.bounce_type, n.channel, n.provider_id, {returning}"""  # noqa: S608 - the caller's CTE names and constants


# --- the create's INSERT (notifications.services) ------------------------------------------------------


@lru_cache(maxsize=1)
def _fields() -> tuple[Any, ...]:
    return tuple(Notification._meta.concrete_fields)


@lru_cache(maxsize=4)
def _columns(alias: str) -> tuple[tuple[Any, str, str], ...]:
    """(field, quoted column, SQL type) of each concrete field: computed once, not per create."""
    connection = connections[alias]
    return tuple((f, connection.ops.quote_name(f.column), f.db_type(connection)) for f in _fields())


def insert_notifications_sql(connection: Any, rows: list[Notification], *, where: str = "") -> tuple[str, list[Any]]:
    """`INSERT INTO notifications … SELECT` of `rows` (only `where` the condition holds).
    The rows travel as one array per column (`… FROM unnest(…)`), in binary (`%b`: psycopg's text
    array dumper was a quarter of a 1,000-item batch's Python, binary ≈ 10 % less CPU a batch), and a
    column whose value is the same in every row (tenant, status, timestamps, counters…) travels
    once; several times faster than bulk_create. One row (the API's single create) has one fixed
    text, built once. For `core.hot_sql` (psycopg's own cursor: Django's binds on the client)."""
    if len(rows) == 1:
        values = rows[0].__dict__
        params = []
        for column, _, _ in _columns(connection.alias):
            value = values[column.attname]
            if isinstance(column, EncryptedTextField):
                value = column.get_prep_value(value)
            elif isinstance(column, JSONField):
                value = json_text(value, column.encoder)
            params.append(value)
        return _single_insert_sql(connection.alias, where), params
    names, selects, params, arrays, aliases = [], [], [], [], []
    for index, (column, name, cast) in enumerate(_columns(connection.alias)):
        values = [row.__dict__[column.attname] for row in rows]
        if isinstance(column, EncryptedTextField):
            values = [column.get_prep_value(v) for v in values]
        elif isinstance(column, JSONField):
            values = [json_text(v, column.encoder) for v in values]
        names.append(name)
        first = values[0]
        if all(v == first for v in values):
            selects.append(f"%s::{cast}")
            params.append(first)
        else:
            selects.append(f"u.c{index}")
            arrays.append((f"%b::{cast}[]", values))
            aliases.append(f"c{index}")
    source = ""
    if arrays:
        source = f" FROM unnest({', '.join(a for a, _ in arrays)}) AS u({', '.join(aliases)})"
    condition = f" WHERE {where}" if where else ""
    sql = f"INSERT INTO notifications ({', '.join(names)}) SELECT {', '.join(selects)}{source}{condition}"  # noqa: S608
    return sql, [*params, *(values for _, values in arrays)]


def json_text(value: Any, encoder: type[json.JSONEncoder] | None) -> str:  # noqa: ANN401
    """A JSON column's text: orjson's for plain values (core.plain_json; ≈ 10 % of a 1,000-item
    batch's Python went to json.dumps), the column's encoder's for anything else. PostgreSQL stores
    jsonb, so the two texts' spacing does not matter."""
    content = plain_json(value)
    return content.decode() if content is not None else json.dumps(value, cls=encoder)


@lru_cache(maxsize=16)
def _single_insert_sql(alias: str, where: str) -> str:
    """`insert_notifications_sql`'s text for one row: every column a parameter."""
    columns = _columns(alias)
    condition = f" WHERE {where}" if where else ""
    return (
        f"INSERT INTO notifications ({', '.join(name for _, name, _ in columns)}) "  # noqa: S608 - model columns
        f"SELECT {', '.join(f'%s::{cast}' for _, _, cast in columns)}{condition}"
    )


# --- the devices of a push to a subscriber (notification_devices) ----------------------------------

# At creation, in the create's transaction: each device the notification goes to, pending.
INSERT_DEVICES = """INSERT INTO notification_devices (tenant_id, notification_id, device_id, kind, provider_id, status,
                                  error_code, updated_at)
SELECT %s, u.n, u.d, u.k, u.p, 'pending', '', now()
FROM unnest(%s::uuid[], %s::uuid[], %s::text[], %s::bigint[]) AS u(n, d, k, p)
ON CONFLICT DO NOTHING"""


def record_devices_sql(source: str) -> str:
    """A data-modifying statement for the record's WITH clause: each device of `source` (columns
    notification_id, device_id, status, code, provider_id) that is still pending takes its new status
    (delivered, failed, deactivated, or pending again after a transient failure), error code and
    provider (the one it went through, or that its next try goes through; null: unchanged)."""
    return f"""UPDATE notification_devices nd SET status = v.status, error_code = v.code,
               provider_id = coalesce(v.provider_id, nd.provider_id), updated_at = now()
        FROM {source} v
        WHERE nd.notification_id = v.notification_id AND nd.device_id = v.device_id AND nd.status = 'pending'
        RETURNING nd.notification_id"""  # noqa: S608 - the caller's CTE name


_CANCEL_SCHEDULED = """UPDATE notifications SET status = 'cancelled', updated_at = now()
WHERE tenant_id = %(tenant)s AND id = ANY(%(ids)s::uuid[]) AND status = 'scheduled'
RETURNING id"""


def cancel_scheduled(tenant_id: Any, ids: list[str], *, using: str = "default") -> list[Any]:  # noqa: ANN401
    """The tenant's notifications among `ids` still `scheduled` end `cancelled` (one statement);
    returns their ids."""
    with connections[using].cursor() as cursor:
        cursor.execute(_CANCEL_SCHEDULED, {"tenant": tenant_id, "ids": ids})
        return [row[0] for row in cursor.fetchall()]
