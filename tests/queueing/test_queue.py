"""The queue API on PostgreSQL: ordering, starvation, leases, fencing, transactions, query counts."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, transaction

from queueing import queue
from queueing.models import LaneLimit, QueueItem
from queueing.wakeup import Doorbell
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def hook(tenant_a):
    return factories.provider(tenant_a)


def age_items(seconds: float, ids=None) -> None:
    """Move items back in time (enqueued, available and leased until) by `seconds` on the database clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queue_state SET enqueued_at = enqueued_at - %s * interval '1 second', "
            "available_at = available_at - %s * interval '1 second', "
            "locked_until = locked_until - %s * interval '1 second' WHERE %s OR item_id = ANY(%s)",
            [seconds, seconds, seconds, ids is None, ids or []],
        )


def test_enqueue_is_one_item_per_notification(tenant_a, hook):
    notes = factories.queued(tenant_a, hook, 3)
    again = [queue.NewItem(notification_id=n.id, tenant_id=tenant_a.pk, provider_id=hook.pk) for n in notes]
    assert queue.enqueue(again) == 0
    assert QueueItem.objects.count() == 3


def test_claim_orders_by_priority_then_age(tenant_a, hook):
    low = factories.queued(tenant_a, hook, 2, priority=1)
    high = factories.queued(tenant_a, hook, 2, priority=9)
    mid = factories.queued(tenant_a, hook, 1, priority=5)
    leases = queue.claim(10)
    assert [lease.notification_id for lease in leases] == [n.id for n in high + mid + low]
    assert all(lease.attempts == 1 for lease in leases)
    assert queue.claim(10) == []  # all leased


def test_starving_items_outrank_priority_oldest_first(tenant_a, hook):
    old_low = factories.queued(tenant_a, hook, 2, priority=0)
    age_items(10)
    factories.queued(tenant_a, hook, 5, priority=9)
    leases = queue.claim(3, starvation_seconds=5)
    ids = {lease.notification_id for lease in leases}
    assert {n.id for n in old_low} <= ids  # the two old priority-0 items made the cut
    assert sum(1 for lease in leases if lease.priority == 9) == 1
    # Without the threshold passed, priority wins.
    queue.release(leases)
    leases = queue.claim(3, starvation_seconds=3600)
    assert [lease.priority for lease in leases] == [9, 9, 9]


def test_an_item_both_starving_and_first_by_priority_is_claimed_once(tenant_a, hook):
    """Both branches of the claim lock the same rows (old and of the top priority): each is leased
    once, and the update, which finds them by ctid, writes each once."""
    old_high = factories.queued(tenant_a, hook, 3, priority=9)
    age_items(10)
    fresh_low = factories.queued(tenant_a, hook, 2, priority=0)
    leases = queue.claim(10, starvation_seconds=5)
    assert sorted(str(lease.notification_id) for lease in leases) == sorted(str(n.id) for n in old_high + fresh_low)
    assert all(lease.attempts == 1 for lease in leases), "one update per row"
    assert QueueItem.objects.filter(lock_token__isnull=False).count() == 5
    assert queue.claim(10, starvation_seconds=5) == []


def test_delayed_items_wait(tenant_a, hook):
    factories.queued(tenant_a, hook, 1, delay=60)
    assert queue.claim(5) == []
    age_items(61)
    assert len(queue.claim(5)) == 1


def test_expired_lease_is_reclaimed_and_zombie_is_fenced(tenant_a, hook):
    factories.queued(tenant_a, hook, 2)
    zombie = queue.claim(2, lease_seconds=30)
    assert queue.claim(2) == []
    age_items(31)  # leases expire on the database clock
    peer = queue.claim(2)
    assert {lease.item_id for lease in peer} == {lease.item_id for lease in zombie}
    assert all(lease.attempts == 2 for lease in peer)
    assert queue.ack(zombie) == set()
    assert queue.extend(zombie) == set()
    assert queue.release(zombie) == set()
    assert queue.ack(peer) == {lease.item_id for lease in peer}
    assert QueueItem.objects.count() == 0


def test_extend_keeps_the_lease(tenant_a, hook):
    factories.queued(tenant_a, hook, 1)
    (lease,) = queue.claim(1, lease_seconds=5)
    age_items(4)
    assert queue.extend([lease], 30) == {lease.item_id}
    age_items(10)  # the original lease would have expired by now
    assert queue.claim(1) == []


def test_release_with_delay_and_refund(tenant_a, hook):
    factories.queued(tenant_a, hook, 2)
    leases = queue.claim(2)
    assert queue.release(leases[:1], 0, refund_attempt=True) == {leases[0].item_id}
    assert queue.release(leases[1:], 120) == {leases[1].item_id}
    (again,) = queue.claim(5)
    assert again.item_id == leases[0].item_id and again.attempts == 1  # the refund undid the first claim
    item = QueueItem.objects.get(pk=leases[1].item_id)
    assert item.lock_token is None and item.attempts == 1


def test_rate_limited_items_only_through_lanes(tenant_a, hook):
    limited = factories.provider(tenant_a, "limited", rate_per_second=1, burst=1)
    factories.queued(tenant_a, limited, 5, rate_limited=True)
    free = factories.queued(tenant_a, hook, 2)
    leases = queue.claim(10)
    assert {lease.notification_id for lease in leases} == {n.id for n in free}
    lane = queue.claim(0, lanes={limited.pk: 3})
    assert len(lane) == 3 and all(lease.provider_id == limited.pk for lease in lane)
    assert len(queue.claim(10, lanes={limited.pk: 10})) == 2


def test_whether_an_item_is_rate_limited_comes_from_the_queues_own_lane_limits(tenant_a, tenant_b):
    """The queue reads its lanes' limits from `lane_limits` (and the tenant's from `tenants`), never
    from the table of whoever owns the lanes: ids with no provider behind them work the same."""
    lane, other = 900_001, 900_002

    def item(tenant, lane_id):  # noqa: ANN001, ANN202
        return queue.NewItem(notification_id=uuid.uuid4(), tenant_id=tenant.pk, provider_id=lane_id)

    assert queue.set_lane_limit(lane, tenant_id=tenant_a.pk, rate_per_second=2.0, burst=4) == 0
    tenant_b.rate_per_second = 5
    tenant_b.save()
    items = [item(tenant_a, lane), item(tenant_a, other), item(tenant_b, other), item(tenant_a, None)]
    assert queue.enqueue(items) == 4
    flags = dict(QueueItem.objects.values_list("notification_id", "rate_limited"))
    assert [flags[i.notification_id] for i in items] == [True, False, True, False]

    # a limit set, changed or removed re-decides that lane's queued items, in the caller's transaction
    assert queue.set_lane_limit(other, tenant_id=tenant_a.pk, rate_per_second=1.0) == 1
    assert queue.set_lane_limit(lane, tenant_id=tenant_a.pk, rate_per_second=3.0) == 0
    assert queue.set_lane_limit(lane, tenant_id=tenant_a.pk, rate_per_second=None) == 1
    flags = dict(QueueItem.objects.values_list("notification_id", "rate_limited"))
    assert [flags[i.notification_id] for i in items] == [False, True, True, False]
    assert list(LaneLimit.objects.values_list("lane_id", "rate_per_second", "burst")) == [(other, 1.0, None)]


def test_a_released_item_that_changes_lane_is_rate_limited_by_the_new_lanes_limit(tenant_a, hook):
    limited = factories.provider(tenant_a, "limited", rate_per_second=1, burst=1)
    [note] = factories.queued(tenant_a, hook, 1)
    [lease] = queue.claim(1)
    source = "(SELECT %s::bigint AS item_id, %s::uuid AS lock_token, 'release' AS settle, 0::float8 AS delay, " \
             "%s::bigint AS provider_id)"
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {queue.settle_ctes(source, reroute=True)} SELECT count(*) FROM released",
                       [lease.item_id, lease.lock_token, limited.pk])
        assert cursor.fetchone() == (1,)
    item = QueueItem.objects.get(notification_id=note.id)
    assert (item.provider_id, item.rate_limited, item.ready) == (limited.pk, True, True)


def test_a_limit_set_while_an_item_is_leased_applies_when_it_comes_back(tenant_a, hook):
    """A leased row is moved only by its holder (its settle finds it by row address): a limit set
    meanwhile leaves the leased item alone, and the item's release decides its lane anew, whether it
    comes back through the record's settle, a give-back or the give-back of a lost claim."""
    notes = factories.queued(tenant_a, hook, 3)
    leases = {lease.notification_id: lease for lease in queue.claim(3)}
    assert len(leases) == 3

    def row(note):  # noqa: ANN001, ANN202
        with connection.cursor() as cursor:
            cursor.execute("SELECT ctid::text, rate_limited FROM queue_state WHERE notification_id = %s", [note.id])
            return cursor.fetchone()

    before = [row(n) for n in notes]
    assert queue.set_lane_limit(hook.pk, tenant_id=tenant_a.pk, rate_per_second=1.0) == 0  # all three leased
    assert [row(n) for n in notes] == before  # not moved, flags as they were
    first, second, third = (leases[n.id] for n in notes)
    source = "(SELECT %s::bigint AS item_id, %s::uuid AS lock_token, 'release' AS settle, 0::float8 AS delay)"
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {queue.settle_ctes(source)} SELECT count(*) FROM released",
                       [first.item_id, first.lock_token])
        assert cursor.fetchone() == (1,)
    assert queue.release([second]) == {second.item_id}
    assert queue.release_claim([third.lock_token]) == 1
    assert [row(n)[1] for n in notes] == [True, True, True]  # each by the limit as it is now
    assert queue.set_lane_limit(hook.pk, tenant_id=tenant_a.pk, rate_per_second=None) == 3  # unleased: re-decided


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("settle", ["ack", "release"])
def test_a_settle_that_meets_a_peers_reclaim_of_the_row_it_found_leaves_it_to_the_peer(tenant_a, hook, settle):
    """The settle finds each item's row address by primary key, then deletes or updates that row. A
    peer re-claiming the item between the two (its lease ran out; the peer's update is committed
    while the settle waits on its lock) leaves a newer version there: the settle re-checks it,
    sees another lock_token and leaves the item to the peer, neither removed nor released."""
    from tests.queueing.test_janitor import autocommit_connection

    factories.queued(tenant_a, hook, 1)
    [lease] = queue.claim(1)
    peer_token = uuid.uuid4()
    source = "(SELECT %s::bigint AS item_id, %s::uuid AS lock_token, %s::text AS settle, 0::float8 AS delay)"
    with autocommit_connection() as peer, autocommit_connection() as late:
        peer.execute("BEGIN")
        peer.execute("UPDATE queue_state SET lock_token = %s, attempts = attempts + 1 WHERE item_id = %s",
                     [peer_token, lease.item_id])  # the peer's claim, not yet committed
        pid = late.info.backend_pid
        settled: dict = {}

        def settle_late() -> None:
            settled["row"] = late.execute(
                f"WITH {queue.settle_ctes(source)} "
                "SELECT (SELECT count(*) FROM settle_found), (SELECT count(*) FROM acked), "
                "(SELECT count(*) FROM released)",
                [lease.item_id, lease.lock_token, settle],
            ).fetchone()

        thread = threading.Thread(target=settle_late, daemon=True)
        thread.start()
        waiting = False
        for _ in range(100):  # the late settle found the row and waits on the peer's lock
            waiting = peer.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                   [pid]).fetchone()[0]
            if waiting:
                break
            time.sleep(0.05)
        assert waiting, "the late settle never waited on the peer's lock"
        peer.execute("COMMIT")
        thread.join(10)
        assert not thread.is_alive()
    assert settled["row"] == (1, 0, 0)  # found under its snapshot, then not ours
    item = QueueItem.objects.get(item_id=lease.item_id)
    assert (item.lock_token, item.attempts) == (peer_token, lease.attempts + 1)  # the peer's, untouched


def test_queue_filter(tenant_a, hook):
    factories.queued(tenant_a, hook, 2, queue_name="email")
    factories.queued(tenant_a, hook, 3, queue_name="sms")
    assert {lease.queue_name for lease in queue.claim(10, queues=["sms"])} == {"sms"}
    assert len(queue.claim(10, queues=["email", "sms"])) == 2


def test_fixed_number_of_statements_per_call(
    tenant_a, hook, django_assert_num_queries, django_capture_on_commit_callbacks
):
    notes = factories.notifications(tenant_a, hook, 300)
    items = [queue.NewItem(notification_id=n.id, tenant_id=tenant_a.pk, provider_id=hook.pk) for n in notes]
    with django_assert_num_queries(1), django_capture_on_commit_callbacks(execute=True) as rings:
        assert queue.enqueue(items) == 300  # INSERT … SELECT unnest; the NOTIFY goes to the ringer after commit
    assert len(rings) == 1
    with django_assert_num_queries(2):
        leases = queue.claim(300)  # stage due items into the ready set, then claim
    with django_assert_num_queries(1):
        queue.extend(leases)
    with django_assert_num_queries(1):
        queue.release(leases[:100], [1.0] * 100)
    with django_assert_num_queries(1):
        assert len(queue.ack(leases[100:])) == 200


@pytest.mark.django_db(transaction=True)
def test_rolled_back_enqueue_leaves_nothing_and_wakes_no_one(tenant_a, hook):
    rings: list[str] = []
    rang = threading.Event()
    bell = Doorbell(lambda payload: (rings.append(payload), rang.set()), application_name="test-doorbell").start()
    try:
        assert bell.connected.wait(5)
        notes = factories.notifications(tenant_a, hook, 2)
        with pytest.raises(RuntimeError), transaction.atomic():
            queue.enqueue([queue.NewItem(notification_id=n.id, tenant_id=tenant_a.pk, provider_id=hook.pk,
                                         queue_name="rolled") for n in notes])
            raise RuntimeError("abort")
        assert QueueItem.objects.count() == 0
        assert not rang.wait(0.3)
        with transaction.atomic():
            queue.enqueue([queue.NewItem(notification_id=notes[0].id, tenant_id=tenant_a.pk, provider_id=hook.pk,
                                         queue_name="committed")])
        assert rang.wait(5)
        assert rings == ["committed"]
    finally:
        bell.stop()


@pytest.mark.parametrize("depth", [200_000, 5_000])
def test_claim_uses_the_index_at_depth(tenant_a, hook, depth, analysed_tables):
    """EXPLAIN at 200k and at 5k waiting items: the claim reads an index, never the whole table.
    At 5k the update once hash-joined a sequential scan of the queue to the rows it had locked."""
    analysed_tables.add("queue_state")
    n = factories.notifications(tenant_a, hook, 1)[0]
    with connection.cursor() as cursor:
        # Synthetic items (one real notification is enough for the FK when constraints are deferred).
        cursor.execute("ALTER TABLE queue_state DROP CONSTRAINT IF EXISTS queue_state_one_live_item_per_notification")
        cursor.execute(
            "INSERT INTO queue_state (queue_name, priority, payload_json, enqueued_at, available_at, attempts, "
            "tenant_id, notification_id, provider_id, rate_limited) "
            "SELECT 'default', (g %% 10), '{}'::jsonb, now() - (g || ' ms')::interval, now(), 0, %s, %s, %s, false "
            "FROM generate_series(1, %s) g",
            [tenant_a.pk, n.id, hook.pk, depth],
        )
        cursor.execute("ANALYZE queue_state")
        cursor.execute("SET LOCAL enable_seqscan = on")
        sql_calls: list[str] = []

        def capture(execute, sql, params, many, context):
            if "WITH RECURSIVE active" in sql:
                sql_calls.append(cursor.mogrify(sql, params) if hasattr(cursor, "mogrify") else sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(capture):
            queue.claim(100)
        (claim_sql,) = sql_calls
        cursor.execute("EXPLAIN " + (claim_sql.decode() if isinstance(claim_sql, bytes) else claim_sql))
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan on queue_state" not in plan, plan
    assert "queue_state_tenant_idx" in plan  # the tenants' skip-scan and their shares
    assert "queue_state_tenant_aged_idx" in plan  # a tenant's own aged items
    assert "Tid Scan on queue_state" in plan, plan  # the update finds the locked rows by ctid


def test_lease_uses_database_clock(tenant_a, hook):
    factories.queued(tenant_a, hook, 1)
    (lease,) = queue.claim(1, lease_seconds=30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM locked_until - now()) FROM queue_state WHERE item_id = %s",
                       [lease.item_id])
        remaining = cursor.fetchone()[0]
    assert 25 < float(remaining) <= 30
    assert isinstance(lease.lock_token, uuid.UUID)


def test_lease_reader_reads_every_column_and_shares_no_payload():
    import json
    from datetime import UTC, datetime

    from queueing.queue import Lease, LeaseReader

    now = datetime.now(UTC)

    def row(item_id: int, payload: str) -> tuple:
        ids = [uuid.uuid4() for _ in range(3)]
        return (item_id, *ids, 7, "notifications", 5, payload, 1, now, now, False)

    flat, nested = '{"channel": "webhook", "n": 1}', '{"route": {"to": ["a"]}}'
    rows = [row(1, flat), row(2, flat), row(3, nested), row(4, nested)]
    read = LeaseReader()
    leases = [read(r) for r in rows]
    assert leases == [
        Lease(item_id=r[0], lock_token=r[1], notification_id=r[2], tenant_id=r[3], provider_id=r[4], queue_name=r[5],
              priority=r[6], payload=json.loads(r[7]), attempts=r[8], enqueued_at=r[9], locked_until=r[10],
              rate_limited=r[11])
        for r in rows
    ]  # fmt: skip
    leases[0].payload["channel"] = "changed"
    leases[2].payload["route"]["to"].append("b")
    assert leases[1].payload == {"channel": "webhook", "n": 1}, "a flat payload parsed once is copied per lease"
    assert leases[3].payload == {"route": {"to": ["a"]}}, "a nested payload is parsed per lease"
    assert read(row(5, flat)).payload == {"channel": "webhook", "n": 1}
    as_dict = row(6, "")[:7] + ({"already": "parsed"},) + row(6, "")[8:]  # a psycopg connection without Django's loader
    assert read(as_dict).payload == {"already": "parsed"}
