"""The SQL that writes this app's tables (notifications, delivery_attempts, idempotency_records,
tenant_queues, and the sequences'), in one place: functions and fragments that the statements of
other modules and apps compose (the dispatcher's record statement, prune's batch, the receipts
statement, the dead-letter redrive), so a change to how a notification's row moves is made here
and nowhere else (tests/test_table_owners.py). Values are always bound parameters; the arguments
of these functions are the caller's CTE names and fixed fragments.
"""

from __future__ import annotations

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
    provider_id, outcome and http_status (for the counters and the breakers)."""
    return f"""
        INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at, finished_at,
                                       outcome, error_class, error_code, error_message, http_status, duration_ms)
        SELECT a.tenant_id, a.notification_id, a.a_number, coalesce(a.a_provider, a.provider_id), a.a_started,
               a.a_finished, a.a_outcome, a.a_class, a.a_code, a.a_message, a.a_status, a.a_duration
        FROM {ours} a WHERE a.a_number IS NOT NULL
        RETURNING provider_id, outcome, http_status"""  # noqa: S608 - the caller's CTE names
