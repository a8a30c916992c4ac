"""The SQL that writes this app's tables (events, event_outcome_batches, event_deliveries,
event_attempts, event_endpoints), in one place: the event lane's claim and record (events.deliveries),
the emitting fragments that other apps' statements compose (events.emit: the dispatcher's record
statement, receipts, suppressions), and the recovery of an endpoint's missed events (events.services).
tests/test_table_owners.py keeps them here.
"""

from __future__ import annotations

# An endpoint's missed events since %(since)s get a pending delivery again (events.services.recover):
# failed ones are reset, events it has no delivery of get one.
RECOVER = """
    INSERT INTO event_deliveries AS d (tenant_id, event_id, endpoint_id, status, attempts, next_attempt_at,
                                       last_error_code, created_at)
    SELECT ev.tenant_id, ev.id, e.id, 'pending', 0, now(), '', now()
    FROM event_endpoints e
    JOIN events ev ON ev.tenant_id = e.tenant_id AND ev.created_at >= %(since)s
    WHERE e.id = %(endpoint)s AND e.enabled AND (e.event_types ? ev.type OR e.event_types ? '*')
    ON CONFLICT (endpoint_id, event_id) DO UPDATE
        SET status = 'pending', next_attempt_at = now(), lock_token = NULL, locked_until = NULL
        WHERE d.status = 'failed'
"""
