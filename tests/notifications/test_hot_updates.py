"""Recording a batch of outcomes updates notifications in place (HOT updates, no index writes)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection

from notifications.delivery import Attempt, Outcome, claim_and_start, record_outcomes
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
