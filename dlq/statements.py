"""The SQL that writes `dead_letter_queue`, in one place: the statements of the redrive and the
discard (dlq.services), and the fragment the dispatcher's record statement composes (dispatch.delivery)
to dead-letter a batch's items in its own statement (tests/test_table_owners.py).
"""

from __future__ import annotations

# Literals stay in the SQL so the statements read as the state machine they enforce.
# The CTE locks the entries in id order (ORDER BY … FOR UPDATE), so two batches that overlap in any
# order wait for each other instead of deadlocking; after a wait PostgreSQL re-checks
# `status = 'open'` on the row's newest version, and a row someone else took drops out.
# The redrive takes open entries whose notification failed or was dead-lettered (dlq.services.redrive).
TAKE_FOR_REDRIVE = """
WITH mine AS (
    SELECT d.id FROM dead_letter_queue d JOIN notifications n ON n.id = d.notification_id
    WHERE d.id = ANY(%(ids)s::uuid[]) AND d.status = 'open'
      AND (%(tenant)s::uuid IS NULL OR d.tenant_id = %(tenant)s::uuid)
      AND n.status IN ('failed', 'dead_lettered')
    ORDER BY d.id
    FOR UPDATE OF d
)
UPDATE dead_letter_queue d
SET status = 'redriven', resolved_at = now(), resolved_by = %(actor)s
FROM mine
WHERE d.id = mine.id AND d.status = 'open'
RETURNING d.id, d.notification_id, d.tenant_id, d.failure_class, d.error_code
"""

# Only if a notification left failed/dead_lettered between the redrive's statements 1 and 2 (nothing
# in OmniPost does that today): its entry goes back to open, so no entry claims a redrive that never
# happened.
REOPEN = """
UPDATE dead_letter_queue SET status = 'open', resolved_at = NULL, resolved_by = '' WHERE id = ANY(%s::uuid[])
"""

# The discard closes open entries without re-queueing anything (dlq.services.discard).
DISCARD = """
WITH mine AS (
    SELECT id FROM dead_letter_queue
    WHERE id = ANY(%(ids)s::uuid[]) AND status = 'open' AND (%(tenant)s::uuid IS NULL OR tenant_id = %(tenant)s::uuid)
    ORDER BY id
    FOR UPDATE
)
UPDATE dead_letter_queue d
SET status = 'discarded', resolved_at = now(), resolved_by = %(actor)s
FROM mine
WHERE d.id = mine.id AND d.status = 'open'
RETURNING d.id, d.notification_id, d.tenant_id, d.failure_class, d.error_code
"""



def insert_dead_letters_sql(ours: str) -> str:
    """The body of the record statement's `dead` CTE: an open entry per row of `ours` with a
    failure class (d_class not null), through the provider it went through."""
    return f"""
        INSERT INTO dead_letter_queue (id, tenant_id, notification_id, provider_id, failure_class, failure_reason,
                                       error_code, last_status_code, attempt_count, status, created_at, resolved_by,
                                       test)
        SELECT gen_random_uuid(), d.tenant_id, d.notification_id, coalesce(d.a_provider, d.provider_id),
               d.d_class, d.d_reason, d.code, d.d_status_code, d.d_count, 'open', now(), '',
               -- the notification's mode (a primary-key probe, for dead letters only)
               (SELECT n.test FROM notifications n WHERE n.id = d.notification_id)
        FROM {ours} d WHERE d.d_class IS NOT NULL"""  # noqa: S608 - the caller's CTE names


def delete_dead_letters_sql(ids: str) -> str:
    """`DELETE … RETURNING 1` of the entries of the notifications whose ids `ids` (an SQL uuid[])
    holds; for prune (operations.retention), which has checked that none is open."""
    return f"DELETE FROM dead_letter_queue WHERE notification_id = ANY({ids}) RETURNING 1"  # noqa: S608
