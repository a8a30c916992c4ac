"""Recording a batch of outcomes updates notifications in place (HOT updates, no index writes)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from dispatch.delivery import Attempt, Outcome, claim_and_start, record_outcomes
from notifications.models import Notification
from tests import factories


def _xact_updates(table: str) -> tuple[int, int]:
    """(updated, of which HOT) rows of `table` in the current transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_updated(%s::regclass), pg_stat_get_xact_tuples_hot_updated(%s::regclass)",
            [table, table],
        )
        return cursor.fetchone()


def test_a_whole_batch_of_outcomes_is_recorded_with_hot_updates(tenant_a):
    prov = factories.provider(tenant_a)
    # Typical webhook notifications (~450 bytes a row): every row on a page is updated by the one
    # statement that records the batch, so each page needs room for all their second versions.
    factories.queued(tenant_a, prov, 120, subject="subject " * 4, body="x" * 200)
    updated_before, hot_before = _xact_updates("notifications")

    prepared, skipped = claim_and_start(200, look_for_starving=False)
    assert len(prepared) == 120 and not skipped
    now = datetime.now(UTC)
    recorded = record_outcomes(
        [
            Outcome(lease=p.lease, kind="delivered",
                    attempt=Attempt(number=1, started_at=now, finished_at=now, outcome="delivered", http_status=200))
            for p in prepared
        ]
    )  # fmt: skip

    assert len(recorded.ours) == 120
    updated, hot = _xact_updates("notifications")
    assert updated - updated_before == 120
    assert hot - hot_before == 120, f"only {hot - hot_before} of 120 status updates were HOT"
    assert set(Notification.objects.values_list("status", flat=True)) == {"delivered"}


@pytest.mark.django_db(transaction=True)
def test_the_claim_and_the_record_are_prepared_once_per_connection(tenant_a):
    """Django turns psycopg's prepared statements off; the hot path's two statements are still
    prepared and planned once (their generic plan: planning the record's CTEs cost more than
    executing a batch of 1,000), and Django's own queries still are not prepared."""
    prov = factories.provider(tenant_a)
    factories.queued(tenant_a, prov, 30)
    for _ in range(3):  # three batches: the same two prepared statements serve every one
        prepared, _ = claim_and_start(10, look_for_starving=False)
        now = datetime.now(UTC)
        record_outcomes([Outcome(lease=p.lease, kind="delivered", attempt=Attempt(1, now, now, "delivered"))
                         for p in prepared])  # fmt: skip
    assert Notification.objects.filter(status="delivered").count() == 30
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        rows = cursor.fetchall()
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "force_generic_plan"
    claims = [r for r in rows if "claimed AS" in r[0]]
    records = [r for r in rows if "INSERT INTO delivery_attempts" in r[0]]
    assert len(claims) == 1 and len(records) == 1, [r[0][:60] for r in rows]
    assert claims[0][1:] == records[0][1:] == (3, 0), "prepared once, one generic plan for every batch"
    # besides them only the doorbell's NOTIFY (rung by the fixtures' creates, through core.hot_sql)
    assert {r[0] for r in rows} - {claims[0][0], records[0][0]} <= {"SELECT pg_notify($1, $2)"}, (
        "Django's own queries are not prepared"
    )


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_can_record_again(tenant_a):
    """The record runs on whatever connection Django has: after Django reconnects, the next batch is
    prepared again and still recorded, its arrays sent in binary."""
    prov = factories.provider(tenant_a)
    factories.queued(tenant_a, prov, 20)
    for _ in range(2):
        prepared, _ = claim_and_start(10, look_for_starving=False)
        now = datetime.now(UTC)
        recorded = record_outcomes([Outcome(lease=p.lease, kind="delivered", attempt=Attempt(1, now, now, "delivered"))
                                    for p in prepared])  # fmt: skip
        assert len(recorded.ours) == 10
        connection.close()
    assert Notification.objects.filter(status="delivered").count() == 20
