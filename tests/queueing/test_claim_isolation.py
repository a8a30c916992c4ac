"""A claim costs the same whatever waits elsewhere: other queues' depth, items in backoff.

Ready items live in partial indexes of their own (`ready`), one led by queue_name; waiting items
(backoff, delayed enqueues) come back through `queue.stage`. A claim is a HOT update (it changes no
indexed column), so leased items stay in the ready indexes and a claim steps over those in flight
ahead of it: a cost bounded by what the dispatchers hold, never by a depth. The plans are read from
EXPLAIN (ANALYZE, FORMAT JSON) of the real statements, on 400,000 synthetic rows.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.utils import timezone

from dispatch import delivery
from queueing import queue
from queueing.models import QueueItem
from tests import factories
from tests.support import plans

pytestmark = pytest.mark.django_db

OTHER_QUEUE_DEPTH = 200_000  # ready, in queue "big"
BACKOFF_DEPTH = 200_000  # waiting out a retry delay, in the claimed queue itself
READY_HERE = 1_000
LEASED_HERE = 300  # in flight at other dispatchers
SLACK = 20  # rows a scan may touch beyond those it hands on (index boundaries, SKIP LOCKED)


@pytest.fixture
def hook(tenant_a, analysed_tables):
    analysed_tables.add("queue_state")  # fill() analyses it
    return factories.provider(tenant_a)


def fill(tenant, hook) -> None:  # noqa: ANN001
    """Synthetic items (one real notification serves the FK once the unique constraint is gone, in
    this test's transaction only). Backoff items carry priority 9, so any index that still held them
    would put them in front of the ready ones; leases, as a claim leaves them (still ready), the oldest
    enqueued_at: in front of every claim of their queue."""
    note = factories.notifications(tenant, hook, 1)[0]
    common = [tenant.pk, note.id, hook.pk]
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queue_state DROP CONSTRAINT IF EXISTS queue_state_one_live_item_per_notification")
        insert = (
            "INSERT INTO queue_state (queue_name, priority, payload_json, enqueued_at, available_at, attempts, "
            "tenant_id, notification_id, provider_id, rate_limited, ready, lock_token, locked_until) "
        )
        cursor.execute(  # another queue's backlog, older than anything in "small"
            insert + "SELECT 'big', 9, '{}'::jsonb, now() - interval '1 hour' + (g || ' ms')::interval, "
            "now() - interval '1 hour', 0, %s, %s, %s, false, true, NULL, NULL FROM generate_series(1, %s) g",
            [*common, OTHER_QUEUE_DEPTH],
        )
        cursor.execute(  # a provider outage: retries due in an hour (release moves enqueued_at there)
            insert + "SELECT 'small', 9, '{}'::jsonb, now() + interval '1 hour' + (g || ' ms')::interval, "
            "now() + interval '1 hour' + (g || ' ms')::interval, 3, %s, %s, %s, false, false, NULL, NULL "
            "FROM generate_series(1, %s) g",
            [*common, BACKOFF_DEPTH],
        )
        cursor.execute(  # leased by peers: the oldest of all, lease running for another 30 s
            insert + "SELECT 'small', 9, '{}'::jsonb, now() - interval '2 hours', now() - interval '2 hours', "
            "1, %s, %s, %s, false, true, gen_random_uuid(), now() + interval '30 seconds' "
            "FROM generate_series(1, %s) g",
            [*common, LEASED_HERE],
        )
        cursor.execute(
            insert + "SELECT 'small', 5, '{}'::jsonb, now() - interval '10 minutes' + (g || ' ms')::interval, "
            "now() - interval '10 minutes', 0, %s, %s, %s, false, true, NULL, NULL FROM generate_series(1, %s) g",
            [*common, READY_HERE],
        )
        cursor.execute("ANALYZE queue_state")


def explain(sql: str, params) -> dict:  # noqa: ANN001
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        (document,) = cursor.fetchone()
    return document[0]["Plan"]


def queue_state_scans(node: dict) -> list[dict]:
    found = [node] if node.get("Relation Name") == "queue_state" else []
    for child in node.get("Plans", []):
        found += queue_state_scans(child)
    return found


def touched(scan: dict) -> float:
    """Rows a scan read: those it returned and those its filter threw away, over all its loops."""
    loops = scan.get("Actual Loops", 1)
    removed = scan.get("Rows Removed by Filter", 0) + scan.get("Rows Removed by Index Recheck", 0)
    return loops * (scan["Actual Rows"] + removed)


def assert_constant_cost(plan: dict, returned: int, in_flight: int = 0) -> None:
    """Each scan reads what it hands on, plus at most the `in_flight` leases ahead of it (and SLACK)."""
    scans = queue_state_scans(plan)
    assert scans, plan
    for scan in scans:
        assert scan["Node Type"] != "Seq Scan", scan
        removed = scan.get("Actual Loops", 1) * scan.get("Rows Removed by Filter", 0)
        assert removed <= in_flight + SLACK, (scan["Node Type"], scan.get("Index Name"), removed)
        assert touched(scan) <= returned + in_flight + SLACK, (scan["Node Type"], scan.get("Index Name"), touched(scan))


def explain_as(plan_mode: str, sql: str, params: dict) -> dict:  # noqa: ANN001
    """The executed plan of the statement as planned for these values (`custom`), or as the dispatcher
    runs it: prepared once per connection and planned once, without its values (`generic`)."""
    if plan_mode == "custom":
        return explain(sql, params)
    connection.ensure_connection()
    explained = plans.explain_generic(connection.connection, sql, params, own_transaction=False)
    assert explained.generic_plans == 1
    return explained.plan["Plan"]


PLAN_MODES = pytest.mark.parametrize("plan_mode", ["custom", "generic"])


@PLAN_MODES
@pytest.mark.parametrize("starving", [False, True], ids=["claim", "claim-with-starvation-branch"])
def test_a_claim_for_one_queue_reads_only_what_it_takes(tenant_a, hook, starving, plan_mode):
    fill(tenant_a, hook)
    sql, params = delivery.claim_statement(100, 30.0, 300.0 if starving else None, ["small"], {}, uuid.uuid4())
    plan = explain_as(plan_mode, sql, params)
    assert plan["Actual Rows"] == 100
    assert_constant_cost(plan, 100, in_flight=LEASED_HERE)
    indexes = {scan.get("Index Name") for scan in queue_state_scans(plan)}
    # None: the TID scan; the aged branch reads the queue's items by age, bounded by the age
    assert indexes - {None} == {"queue_state_queue_tenant_idx"} | ({"queue_state_starving_idx"} if starving else set())
    claimed = QueueItem.objects.filter(ready=True, lock_token=params["token"])
    assert claimed.count() == 100 and set(claimed.values_list("queue_name", "priority").distinct()) == {("small", 5)}


@PLAN_MODES
def test_a_claim_over_all_queues_skips_backoff_and_leases(tenant_a, hook, plan_mode):
    fill(tenant_a, hook)
    sql, params = delivery.claim_statement(100, 30.0, 300.0, None, {}, uuid.uuid4())
    plan = explain_as(plan_mode, sql, params)
    assert plan["Actual Rows"] == 100
    assert_constant_cost(plan, 100, in_flight=LEASED_HERE)
    claimed = QueueItem.objects.filter(lock_token=params["token"])
    assert set(claimed.values_list("queue_name", flat=True).distinct()) == {"big"}  # oldest, starving


def test_the_stager_reads_only_due_rows(tenant_a, hook):
    fill(tenant_a, hook)
    with connection.cursor() as cursor:  # 50 retries come due, and 10 leases of a dead dispatcher expire
        cursor.execute(
            "UPDATE queue_state SET available_at = now() - interval '1 second' WHERE item_id IN "
            "(SELECT item_id FROM queue_state WHERE NOT ready AND lock_token IS NULL ORDER BY available_at LIMIT 50)"
        )
        cursor.execute(
            "UPDATE queue_state SET available_at = now() - interval '1 second', locked_until = now() - interval "
            "'1 second' WHERE item_id IN (SELECT item_id FROM queue_state WHERE lock_token IS NOT NULL LIMIT 10)"
        )
        cursor.execute("ANALYZE queue_state")
        cursor.execute("SAVEPOINT before_explain")
    stage_sql = (
        "WITH due AS (SELECT ctid FROM queue_state WHERE NOT ready AND available_at <= now() "
        "ORDER BY available_at LIMIT %s FOR UPDATE SKIP LOCKED) "
        "UPDATE queue_state SET ready = true WHERE ctid = ANY(ARRAY(SELECT ctid FROM due)) RETURNING rate_limited"
    )
    plan = explain(stage_sql, [queue.STAGE_LIMIT])
    assert plan["Actual Rows"] == 50  # expired leases never left the ready set: claimable as they are
    assert_constant_cost(plan, 50)
    with connection.cursor() as cursor:
        cursor.execute("ROLLBACK TO SAVEPOINT before_explain")
    assert queue.stage() == queue.Staged(count=50, rate_limited=0)  # the function runs the same statement
    assert queue.stage() == queue.Staged()


def test_staging_brings_back_retries_and_expired_leases_are_claimable_unless_extended(tenant_a, hook):
    factories.queued(tenant_a, hook, 3)
    first, second, third = queue.claim(3, lease_seconds=30)
    assert queue.release([first], 60) == {first.item_id}  # a retry in a minute
    ready = dict(QueueItem.objects.values_list("item_id", "ready"))  # a lease stays in the ready set
    assert ready == {first.item_id: False, second.item_id: True, third.item_id: True}

    def shift(seconds: float) -> None:  # move the database's idea of every item's times back
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE queue_state SET available_at = available_at - %s * interval '1 second', "
                "enqueued_at = enqueued_at - %s * interval '1 second', "
                "locked_until = locked_until - %s * interval '1 second'",
                [seconds, seconds, seconds],
            )

    shift(31)  # the leases have run out, the retry is not due yet
    assert queue.extend([third], 30) == {third.item_id}  # its holder is alive: out of reach again
    assert queue.stage() == queue.Staged()  # nothing to stage: an expired lease never left the ready set
    (again,) = queue.claim(5)
    assert again.item_id == second.item_id and again.attempts == 2
    assert queue.ack([second]) == set(), "the old holder is fenced once a peer re-claimed"
    shift(30)  # the retry is due, and the extended lease has run out too (and `again`'s)
    back = {lease.item_id for lease in queue.claim(5, lease_seconds=30)}
    assert back == {first.item_id, second.item_id, third.item_id}


def test_delayed_enqueue_waits_outside_the_ready_set(tenant_a, hook):
    factories.queued(tenant_a, hook, 2, delay=60)
    factories.queued(tenant_a, hook, 1)
    assert sorted(QueueItem.objects.values_list("ready", flat=True)) == [False, False, True]
    assert len(queue.claim(5)) == 1


def hot_and_all_updates() -> tuple[int, int]:
    """This transaction's updates of queue_state so far: (HOT ones, all)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_hot_updated('queue_state'::regclass), "
            "pg_stat_get_xact_tuples_updated('queue_state'::regclass)"
        )
        return cursor.fetchone()


def leased_rows(tenant, hook, count: int) -> list[queue.Lease]:  # noqa: ANN001
    """`count` items as a claim leaves them (ready, leased for 30 s), written by one INSERT: each row
    has one version, so a single update of it has the page's room to itself."""
    note = factories.notifications(tenant, hook, 1)[0]
    token = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queue_state DROP CONSTRAINT IF EXISTS queue_state_one_live_item_per_notification")
        cursor.execute(
            "INSERT INTO queue_state (queue_name, priority, payload_json, enqueued_at, available_at, attempts, "
            "tenant_id, notification_id, provider_id, rate_limited, ready, lock_token, locked_until) "
            "SELECT 'default', 5, '{}'::jsonb, now(), now(), 1, %s, %s, %s, false, true, %s, "
            "now() + interval '30 seconds' FROM generate_series(1, %s) RETURNING item_id",
            [tenant.pk, note.id, hook.pk, token, count],
        )
        ids = [row[0] for row in cursor.fetchall()]
    now = timezone.now()
    return [queue.Lease(i, token, note.id, tenant.pk, hook.pk, "default", 5, {}, 1, now, now, False) for i in ids]


def test_a_claim_writes_no_index(tenant_a, hook):
    """A claim changes no indexed column: each claimed row's new version is a HOT update, written on
    its own page (queue_state's fillfactor leaves the room) and into no index."""
    factories.queued(tenant_a, hook, 200)
    before_hot, before = hot_and_all_updates()
    assert len(queue.claim(200, lease_seconds=30)) == 200
    hot, updates = hot_and_all_updates()
    assert (hot - before_hot, updates - before) == (200, 200)


def test_extending_and_giving_back_untried_write_no_index_and_a_retry_leaves_the_ready_set(tenant_a, hook):
    leases = leased_rows(tenant_a, hook, 150)
    before_hot, before = hot_and_all_updates()
    assert queue.extend(leases[:50], 30) == {lease.item_id for lease in leases[:50]}
    assert len(queue.release(leases[50:100], 0.0, refund_attempt=True)) == 50
    hot, updates = hot_and_all_updates()
    assert (hot - before_hot, updates - before) == (100, 100)
    assert len(queue.release(leases[100:], 60.0)) == 50  # a retry in a minute: indexed columns change
    hot_after, updates_after = hot_and_all_updates()
    assert (hot_after - hot, updates_after - updates) == (0, 50)
    ready = dict(QueueItem.objects.values_list("item_id", "ready"))
    assert all(ready[lease.item_id] for lease in leases[:100]) and not any(ready[x.item_id] for x in leases[100:])
