"""Rows made in bulk for benchmarks and tests, in SQL (`INSERT … SELECT generate_series`), where
thousands to millions through the API or the ORM would take longer than what they measure.

`notifications_insert` is the one statement that writes `notifications` this way: a caller wraps it
in a CTE (to queue the rows, benchmarks.runner), adds `RETURNING id` (tests.factories), or runs it
as it is (a history of delivered rows, bench/fanout_bench.py)."""

from __future__ import annotations

from typing import Any


def notifications_insert(
    tenant_id: Any,  # noqa: ANN401 - a UUID or its text
    provider_id: int,
    count: int,
    *,
    channel: str = "webhook",
    recipient: str = "noop",
    recipient_masked: str = "noop",
    subject: str = "",
    body: str = "",
    priority: int = 5,
    queue: str = "default",
    status: str = "queued",
    age_seconds: float = 0.0,
) -> tuple[str, list[Any]]:
    """(SQL, parameters): `count` notifications of one tenant, provider and recipient (`recipient` as
    stored: encrypted by the caller where the provider reads it), created `age_seconds` ago; a
    `delivered` one was delivered then, after one attempt."""
    delivered = status == "delivered"
    sql = """
        INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
            subject, body, priority, queue, status, metadata, attempt_count, attempt_offset, last_error_code,
            created_at, updated_at, delivered_at)
        SELECT gen_random_uuid(), %s, %s, %s, %s, %s, '{}', %s, %s, %s, %s, %s, '{}', %s, 0, '',
               now() - %s * interval '1 second', now() - %s * interval '1 second',
               CASE WHEN %s THEN now() - %s * interval '1 second' END
        FROM generate_series(1, %s)"""
    params = [tenant_id, channel, recipient, recipient_masked, provider_id, subject, body, priority, queue, status,
              1 if delivered else 0, age_seconds, age_seconds, delivered, age_seconds, count]  # fmt: skip
    return sql, params
