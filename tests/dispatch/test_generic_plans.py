"""The generic plans the dispatcher keeps for its hot statements (planned once per connection,
dispatch.delivery.prepare_when_asked) stay linear in the batch and read rows by index.

A generic plan estimates every unnest of an array parameter at 10 rows: a join of two such inputs
(or of one with a CTE) was planned as a nested loop, run 1,000 × 1,000 times for a batch of 1,000,
and an UPDATE joined with its own CTE as a sequential scan of the whole table.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.utils import timezone

from dispatch.delivery import Attempt, Outcome, claim_and_start, record_statement
from events import deliveries, emit
from events.models import EventDelivery
from events.services import create_endpoint
from tests import factories
from tests.support import plans
from tests.support.outbox import fan_out

pytestmark = pytest.mark.django_db(transaction=True)

# Node types whose inner repetition is what made a plan quadratic: rescanning a CTE's or a
# function's (unnest's) rows once per row of the other side. (A small table's one page may be
# read per row: its statistics say it is small, and the janitor keeps them fresh.)
_RESCANNED = {"CTE Scan", "Function Scan"}
_LARGE = ("notifications", "queue_state", "events", "event_deliveries", "delivery_attempts", "dead_letter_queue")


def _endpoint(tenant):  # noqa: ANN001, ANN202
    return create_endpoint(tenant, name="ops", url="https://hooks.example.com/e", event_types=["*"], actor="test")[0]


def _outcomes(prepared: list) -> list[Outcome]:
    now = timezone.now()
    retry = Attempt(1, now, now, "transient_error", error_code="http_503", http_status=503)
    dead = Attempt(1, now, now, "permanent_error", error_code="http_404", http_status=404)
    delivered = Attempt(1, now, now, "delivered", http_status=200)
    return [
        Outcome(p.lease, "retry", retry, retry_delay=30.0, error_code="http_503") if i % 10 == 0
        else Outcome(p.lease, "dead_lettered", dead, error_code="http_404", failure_class="permanent",
                     failure_reason="http_404", status_code=404) if i % 10 == 1
        # an even one's provider gave a message id (as SES does), an odd one's none (as a webhook)
        else Outcome(p.lease, "delivered", Attempt(1, now, now, "delivered", http_status=200, message_id=f"m-{i}"))
        if i % 2 == 0
        else Outcome(p.lease, "delivered", delivered)
        for i, p in enumerate(prepared)
    ]  # fmt: skip


def test_the_record_statements_generic_plan_is_linear_in_the_batch(tenant_a):
    _endpoint(tenant_a)  # every outcome but a retry also makes an event
    factories.bulk_queued_sql(tenant_a, factories.provider(tenant_a), 20_000)  # a backlog behind the batch
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    prepared, _ = claim_and_start(600, lease_seconds=30)
    assert len(prepared) == 600
    sql, params = record_statement(_outcomes(prepared))
    connection.ensure_connection()

    def written(cursor):  # noqa: ANN001, ANN202
        cursor.execute("SELECT (SELECT count(*) FROM delivery_attempts), (SELECT count(*) FROM dead_letter_queue), "
                       "(SELECT coalesce(sum(cardinality(notification_ids)), 0) FROM event_outcome_batches), "
                       "(SELECT count(*) FROM queue_state), (SELECT count(*) FROM provider_messages)")  # fmt: skip
        return cursor.fetchone()

    explained = plans.explain_generic(connection.connection, sql, params, inside=written)
    assert explained.generic_plans == 1
    # attempts, dead letters, events (not of retries), queue, message ids (the delivered even ones)
    assert explained.seen == (600, 60, 540, 20_000 - 540, 240)
    rescans = [(n["Node Type"], n.get("Relation Name") or n.get("CTE Name"), n["Actual Loops"])
               for n in plans.nodes(explained.plan["Plan"])
               if n["Node Type"] in _RESCANNED and n["Actual Loops"] > 1]  # fmt: skip
    assert rescans == [], rescans
    assert not {("Seq Scan", table) for table in _LARGE} & plans.scans(explained.plan["Plan"])


@pytest.mark.parametrize("stage", ["due-deliveries", "fan-out", "outcomes"])
def test_the_event_lanes_claim_reads_deliveries_and_the_outbox_by_index_under_a_generic_plan(tenant_a, stage):
    """20,000 notifications, 5,000 deliveries (due, or already delivered), 5,000 events not fanned
    out yet (or none) and a batch of 1,000 outcomes: a claim of 100 takes the due deliveries first,
    else fans out 100 events, else opens the batch into 1,000 events, reading every table by index."""
    _endpoint(tenant_a)

    def made(count):  # noqa: ANN001, ANN202
        emit.emit(None, tenant_a.pk, "notification.delivered",
                  [{"notification_id": str(uuid.uuid4()), "status": "delivered"} for _ in range(count)])  # fmt: skip

    factories.bulk_queued_sql(tenant_a, factories.provider(tenant_a), 20_000)
    made(5000)
    assert fan_out() == 5000
    if stage != "due-deliveries":
        EventDelivery.objects.update(status="delivered")
    if stage != "outcomes":
        made(5000)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO event_outcome_batches (tenant_ids, notification_ids, statuses, attempt_counts, provider_ids,"
            " error_codes) SELECT array_agg(tenant_id), array_agg(id), array_agg('delivered'::text), array_agg(1),"
            " array_agg(provider_id), array_agg(''::text) FROM (SELECT * FROM notifications LIMIT 1000) n"
        )  # fmt: skip
        # as the janitor keeps them: rows updated above leave dead index entries that only the first
        # scan after them would step over
        cursor.execute("VACUUM ANALYZE")
    connection.ensure_connection()

    def leased(cursor):  # noqa: ANN001, ANN202
        cursor.execute("SELECT count(*) FILTER (WHERE lock_token IS NOT NULL), count(*), (SELECT count(*) FROM events)"
                       " FROM event_deliveries")  # fmt: skip
        return cursor.fetchone()

    sql, params = deliveries.claim_statement(100, 30, uuid.uuid4())
    explained = plans.explain_generic(connection.connection, sql, params, inside=leased)
    assert explained.generic_plans == 1
    assert explained.seen == {"due-deliveries": (100, 5000, 10_000), "fan-out": (100, 5100, 10_000),
                              "outcomes": (0, 5000, 6000)}[stage]  # fmt: skip
    scans = plans.scans(explained.plan["Plan"])
    assert not {("Seq Scan", table) for table in _LARGE} & scans, sorted(map(str, scans))
    # pages touched grow with the claim, not the tables: ≈ 12 a claimed delivery, ≈ 30 a fanned-out
    # event (the event's new row version and the delivery's, with their index entries), ≈ 10 an
    # event made from outcomes
    budget = {"due-deliveries": 4000, "fan-out": 4000, "outcomes": 12_000}[stage]
    assert explained.plan["Plan"]["Shared Hit Blocks"] + explained.plan["Plan"].get("Shared Read Blocks", 0) < budget


def test_the_record_statement_planned_on_an_empty_queue_reads_only_the_batchs_items_as_it_grows(tenant_a):
    """The queue's size swings within a second: a generic plan made on the statistics of a nearly
    empty queue (an ANALYZE between two of a broadcast's shares) must still read the queue by the
    batch's item ids once thousands of items wait. Joined only through its CTE, the settle was planned
    as the whole queue read by primary key with the batch rescanned for each row (40 → 300 ms a
    record during a broadcast)."""
    provider = factories.provider(tenant_a)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queue_state SET (autovacuum_enabled = false)")  # statistics stay ours
        try:
            # a queue that held thousands (its pages) and is nearly empty when analyzed: one row
            factories.bulk_queued_sql(tenant_a, provider, 3_000)
            cursor.execute("DELETE FROM queue_state WHERE item_id > (SELECT min(item_id) FROM queue_state)")
            cursor.execute("VACUUM (ANALYZE, TRUNCATE false) queue_state")  # as the janitor does
            cursor.execute("SELECT reltuples, relpages FROM pg_class WHERE relname = 'queue_state'")
            assert cursor.fetchone()[0] == 1
            factories.bulk_queued_sql(tenant_a, provider, 3_000)  # the queue grows; nothing re-analyzes it
            prepared, _ = claim_and_start(100, lease_seconds=30)
            assert len(prepared) == 100
            sql, params = record_statement(_outcomes(prepared))
            connection.ensure_connection()

            def left(cursor):  # noqa: ANN001, ANN202
                cursor.execute("SELECT count(*) FROM queue_state")
                return cursor.fetchone()[0]

            explained = plans.explain_generic(connection.connection, sql, params, inside=left)
        finally:
            cursor.execute("ALTER TABLE queue_state RESET (autovacuum_enabled)")
    assert explained.generic_plans == 1
    assert explained.seen == 3_001 - 90  # the 90 acked left; the 10 retries stay, released
    queue_read = [(n["Node Type"], (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"])
                  for n in plans.nodes(explained.plan["Plan"]) if n.get("Relation Name") == "queue_state"]  # fmt: skip
    assert queue_read and max(rows for _, rows in queue_read) <= 100, queue_read
    assert ("Seq Scan", "queue_state") not in plans.scans(explained.plan["Plan"])
    rescans = [(n["Node Type"], n.get("CTE Name"), n["Actual Loops"]) for n in plans.nodes(explained.plan["Plan"])
               if n["Node Type"] in _RESCANNED and n["Actual Loops"] > 1]  # fmt: skip
    assert rescans == [], rescans
