"""When a channel fallback is due or cancelled (routing.fallback) as a table of cases, and the SQL the
record and receipts statements carry it out with (`decision_sql`, composed by notifications.fallback)
run over the same cases on PostgreSQL: both decide alike."""

from __future__ import annotations

import pytest
from django.db import connection

from notifications.models import ReceiptStatus, Status
from routing.fallback import ON_OUTCOME, ON_RECEIPT, decide, decision_sql, delay_seconds

# (what the original's outcome or receipt is, what becomes of its fallback: due now, due after
# after_seconds, cancelled, or nothing yet)
OUTCOMES = {
    "delivered": "after", "failed": "now", "dead_lettered": "now", "suppressed": "cancel",
    "queued": None, "retrying": None, "dispatching": None, "scheduled": None, "cancelled": None, None: None,
}  # fmt: skip
RECEIPTS = {
    "bounced": "now", "undelivered": "now", "failed": "now", "delivered": "cancel", "complained": "cancel",
    None: None,
}  # fmt: skip


def _what(decision) -> str | None:  # noqa: ANN001
    if decision is None:
        return None
    return "cancel" if decision.cancel else "after" if decision.after else "now"


def test_every_status_and_receipt_is_in_the_table():
    assert set(OUTCOMES) - {None} == set(Status.values)
    assert set(RECEIPTS) - {None} == set(ReceiptStatus.values)


@pytest.mark.parametrize(("value", "what"), OUTCOMES.items())
def test_an_outcome_decides_as_the_table_says(value, what):
    assert _what(decide(ON_OUTCOME, value)) == what


@pytest.mark.parametrize(("value", "what"), RECEIPTS.items())
def test_a_receipt_decides_as_the_table_says(value, what):
    assert _what(decide(ON_RECEIPT, value)) == what


def test_a_due_fallback_waits_after_seconds_only_after_an_acceptance():
    assert delay_seconds(decide(ON_OUTCOME, "delivered"), 300) == 300.0
    assert delay_seconds(decide(ON_OUTCOME, "delivered"), None) == 0.0  # a step without after_seconds
    assert delay_seconds(decide(ON_OUTCOME, "failed"), 300) == 0.0
    assert delay_seconds(decide(ON_RECEIPT, "bounced"), 300) == 0.0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("table", "cases"), [(ON_OUTCOME, OUTCOMES), (ON_RECEIPT, RECEIPTS)], ids=["outcome", "receipt"]
)
def test_the_sql_decides_as_the_rule(table, cases):
    decided, cancels, delay = decision_sql(table, "c.value", "c.after")
    sql = f"SELECT {decided}, {cancels}, {delay} FROM (SELECT %s::text AS value, %s::float8 AS after) c"  # noqa: S608
    checked = 0
    with connection.cursor() as cursor:
        for value in cases:
            for after in (None, 0, 42.5):
                cursor.execute(sql, [value, after])
                in_sql, cancel_in_sql, delay_in_sql = cursor.fetchone()
                decision = decide(table, value)
                assert bool(in_sql) == (decision is not None), (value, after)
                if decision is not None:
                    assert (cancel_in_sql, delay_in_sql) == (decision.cancel, delay_seconds(decision, after)), value
                    checked += 1
    assert checked == 3 * sum(1 for what in cases.values() if what is not None)
