"""The queue janitor (VACUUM of churning tables when dead rows pile up, one process at a time), run as
maintenance on a process's own connection; the doorbell beside it only wakes."""

from __future__ import annotations

import re
import threading
import uuid

import psycopg
import pytest
from django.db import connection

from providers.models import Provider
from queueing import janitor
from queueing.janitor import Janitor
from queueing.wakeup import Doorbell, _conninfo
from tests import factories
from tests.queueing.dispatch_support import wait_until
from tests.support import plans

pytestmark = pytest.mark.django_db(transaction=True)


def autocommit_connection() -> psycopg.Connection:
    return psycopg.connect(**_conninfo("default", "omnipost-test-janitor"))


def dead_rows(conn: psycopg.Connection, table: str) -> int:
    row = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", [table]).fetchone()
    return row[0]


def test_the_tables_watched_come_from_the_apps_that_own_them(monkeypatch):
    monkeypatch.setattr(janitor, "_CHURNING", list(janitor._CHURNING))
    monkeypatch.setattr(janitor, "_DEFERRED", list(janitor._DEFERRED))
    assert Janitor().tables[:4] == ("queue_state", "scheduled_jobs", "rate_limit_buckets", "workers")
    # events.apps registers the event lane's: churning, and left alone while the process is busy
    assert {"event_deliveries", "events", "event_outcome_batches"} <= set(Janitor().tables)
    assert set(Janitor().deferred) == {"events", "event_deliveries", "event_attempts", "event_outcome_batches"}
    janitor.register(("some_outbox",), deferred=("some_outbox", "events"))
    janitor.register(("some_outbox",))
    assert Janitor().tables.count("some_outbox") == 1 and Janitor().deferred.count("events") == 1
    assert Janitor(tables=("queue_state",)).tables == ("queue_state",)


def leave_dead_queue_rows(tenant, count: int) -> None:  # noqa: ANN001
    """Enqueue `count` items and delete them, as acks do, then publish the counts at once."""
    provider = Provider.objects.filter(tenant=tenant).first() or factories.provider(tenant)
    factories.queued(tenant, provider, count)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM queue_state")
        cursor.execute("SELECT pg_stat_force_next_flush()")
    connection.close()  # the backend publishes its statistics as it goes idle / exits


def claim_pages_read(conn: psycopg.Connection) -> int:
    """Buffers the claim's index scan touches (in a rolled-back transaction)."""
    with conn.transaction(force_rollback=True):
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT item_id FROM queue_state "
            "WHERE ready AND NOT rate_limited AND priority >= 0 AND available_at <= now() "  # as queue.claim_ctes
            "ORDER BY priority DESC, enqueued_at "
            "LIMIT 10 FOR UPDATE SKIP LOCKED"
        ).fetchone()[0][0]["Plan"]
    return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]


def test_due_tables_follow_the_dead_row_threshold():
    janitor = Janitor(min_dead=1000, live_fraction=0.5)
    stats = [
        ("queue_state", 999, 0),
        ("scheduled_jobs", 1000, 0),
        ("workers", 1400, 1000),
        ("rate_limit_buckets", 1500, 1000),
    ]
    assert janitor.due(stats) == ["scheduled_jobs", "rate_limit_buckets"]


def test_looks_at_most_once_per_interval(tenant_a):
    now = [100.0]
    janitor = Janitor(min_dead=1, every=2.0, clock=lambda: now[0])
    leave_dead_queue_rows(tenant_a, 50)
    with autocommit_connection() as conn:
        assert "queue_state" in janitor.maybe_vacuum(conn)
        leave_dead_queue_rows(tenant_a, 50)
        now[0] += 1.0
        assert janitor.maybe_vacuum(conn) == []  # too soon: not even a look at the statistics
        now[0] += 1.5
        assert "queue_state" in janitor.maybe_vacuum(conn)


def test_vacuum_clears_dead_rows_and_keeps_the_claim_cheap(tenant_a):
    leave_dead_queue_rows(tenant_a, 3000)
    with autocommit_connection() as conn:
        assert dead_rows(conn, "queue_state") >= 3000
        before = claim_pages_read(conn)
        assert Janitor(min_dead=2000).maybe_vacuum(conn) == ["queue_state"]
        conn.execute("SELECT pg_stat_clear_snapshot()")
        assert dead_rows(conn, "queue_state") == 0
        after = claim_pages_read(conn)
    assert after * 5 < before, (before, after)  # the claim no longer steps over dead index entries


def test_event_tables_wait_while_the_process_has_a_backlog(tenant_a):
    """With `busy` true the event lane's tables are neither vacuumed nor analyzed (the lane holds back
    then, and the DB thread is the notifications'); the queue's are; once the backlog is gone, they are."""
    leave_dead_queue_rows(tenant_a, 100)
    with connection.cursor() as cursor:  # stale `events` statistics
        cursor.execute("INSERT INTO events (id, tenant_id, type, payload, created_at) SELECT gen_random_uuid(), %s, "
                       "'notification.delivered', '{}', now() FROM generate_series(1, 1500)", [tenant_a.pk])
        cursor.execute("SELECT pg_stat_force_next_flush()")
    connection.close()
    backlog = [True]
    janitor = Janitor(min_dead=1, analyze_min=1000, every=0.0, busy=lambda: backlog[0])
    with autocommit_connection() as conn:
        assert "queue_state" in janitor.maybe_vacuum(conn)
        assert "events" not in janitor.analyzed
        backlog[0] = False
        leave_dead_queue_rows(tenant_a, 100)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        janitor.maybe_vacuum(conn)
        assert "events" in janitor.analyzed


def stale_subscribers(tenant, prefix: str = "j", count: int = 1500, *, analyze: bool = True) -> None:  # noqa: ANN001
    """Statistics of `subscribers` (a table that is not churning) made stale by `count` new rows."""
    with connection.cursor() as cursor:
        if analyze:
            cursor.execute("ANALYZE subscribers")
        cursor.execute("INSERT INTO subscribers (id, tenant_id, external_id, email_masked, phone_masked, push_tokens, "
                       "push_tokens_masked, timezone, preferences) SELECT gen_random_uuid(), %s, %s || n, '', '', '', "
                       "'[]', '', '{}' FROM generate_series(1, %s) n", [tenant.pk, prefix, count])  # fmt: skip
        cursor.execute("SELECT pg_stat_force_next_flush()")
    connection.close()


def test_a_working_dispatchers_janitor_leaves_the_work_to_a_live_scheduler(tenant_a, monkeypatch):
    """The dispatcher's janitor (busy_factor 5): while its claims find work and a scheduler is alive (its
    janitor runs between its batches and never holds back), a table is due only past five times its
    threshold and no stale table is analyzed; without work, it vacuums and analyzes as any janitor."""
    from queueing import heartbeat

    monkeypatch.setattr(janitor, "TENDED_SECONDS", 0)  # autovacuum's work does not count here
    scheduler = heartbeat.register("scheduler")
    leave_dead_queue_rows(tenant_a, 3000)
    stale_subscribers(tenant_a)
    working = [True]
    keeper = Janitor(min_dead=1000, analyze_min=1000, every=0.0, working=lambda: working[0], busy_factor=5.0)
    with autocommit_connection() as conn:
        assert keeper.maybe_vacuum(conn) == [] and keeper.analyzed == []  # 3,000 < 5 x 1,000
        assert dead_rows(conn, "queue_state") >= 3000
        leave_dead_queue_rows(tenant_a, 3000)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        assert keeper.maybe_vacuum(conn) == ["queue_state"]  # 6,000 dead: past five times
        assert keeper.analyzed == []
        working[0] = False
        conn.execute("SELECT pg_stat_clear_snapshot()")
        keeper.maybe_vacuum(conn)
        assert "subscribers" in keeper.analyzed
        # a stopped scheduler tends nothing: working, the dispatcher's janitor does it all itself
        heartbeat.stop(scheduler)
        working[0] = True
        stale_subscribers(tenant_a, "k", 3000, analyze=False)  # past 1,000 + the 1,500 known
        leave_dead_queue_rows(tenant_a, 3000)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        assert keeper.maybe_vacuum(conn) == ["queue_state"] and "subscribers" in keeper.analyzed


def test_a_working_janitor_that_nobody_else_helps_vacuums_as_any_janitor(tenant_a, monkeypatch):
    """Working, but no scheduler runs and autovacuum vacuumed nothing lately: the factor does not apply."""
    monkeypatch.setattr(janitor, "TENDED_SECONDS", 0)  # whatever the tests before did, not "lately"
    leave_dead_queue_rows(tenant_a, 3000)
    keeper = Janitor(min_dead=1000, every=0.0, busy=lambda: True, working=lambda: True, busy_factor=5.0)
    with autocommit_connection() as conn:
        assert keeper.maybe_vacuum(conn) == ["queue_state"]


def test_a_churning_tables_statistics_go_stale_with_its_size_not_its_churn(tenant_a):
    """A queue of steady depth rewrites every row without its statistics growing false: analyzing it at
    each look (every 2 s) planned every statement reading it again. Grown past them, it is analyzed."""
    provider = factories.provider(tenant_a)
    with autocommit_connection() as conn:
        conn.execute("VACUUM ANALYZE queue_state")
    for _ in range(3):  # 4,500 rows in and out: churn, the size unchanged
        factories.queued(tenant_a, provider, 1500)
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM queue_state")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    connection.close()
    keeper = Janitor(min_dead=10**9, analyze_min=1000, every=0.0)
    with autocommit_connection() as conn:
        changed = conn.execute("SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'queue_state'")
        assert changed.fetchone()[0] >= 4500
        keeper.maybe_vacuum(conn)
        assert "queue_state" not in keeper.analyzed
        factories.queued(tenant_a, provider, 1500)  # grown from 0 to 1,500 rows
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        connection.close()
        conn.execute("SELECT pg_stat_clear_snapshot()")
        keeper.maybe_vacuum(conn)
        assert "queue_state" in keeper.analyzed


def test_nothing_due_nothing_vacuumed(tenant_a):
    leave_dead_queue_rows(tenant_a, 10)
    with autocommit_connection() as conn:
        assert Janitor(min_dead=10_000).maybe_vacuum(conn) == []


def test_a_second_process_skips_while_one_vacuums(tenant_a):
    leave_dead_queue_rows(tenant_a, 100)
    with autocommit_connection() as holder, autocommit_connection() as conn:
        holder.execute("SELECT pg_advisory_lock(%s)", [0x6F6D6E6970_7661])
        assert Janitor(min_dead=1).maybe_vacuum(conn) == []
        holder.execute("SELECT pg_advisory_unlock_all()")
        assert "queue_state" in Janitor(min_dead=1).maybe_vacuum(conn)


def test_maintenance_vacuums_on_djangos_connection_and_never_inside_a_transaction(tenant_a):
    from django.db import transaction

    from queueing.janitor import vacuum_on_default

    leave_dead_queue_rows(tenant_a, 3000)
    with transaction.atomic():  # VACUUM cannot run in a transaction block: skipped, not failed
        assert vacuum_on_default(Janitor(min_dead=2000)) == []
    assert vacuum_on_default(Janitor(min_dead=2000)) == ["queue_state"]
    with autocommit_connection() as conn:
        assert dead_rows(conn, "queue_state") == 0


def test_the_dispatchers_maintenance_loop_runs_the_janitor_on_its_db_thread(tenant_a):
    """dispatch.upkeep.maintain hands the janitor to the dispatcher's `db` (its one SQL thread)."""
    import asyncio

    from dispatch import upkeep

    leave_dead_queue_rows(tenant_a, 3000)
    ran: list[tuple[str, list[str]]] = []

    async def db(fn, *args):  # noqa: ANN001, ANN202 - as Dispatcher.db, on a thread of its own
        def call():  # noqa: ANN202
            try:
                return fn(*args)
            finally:
                connection.close()

        done = await asyncio.to_thread(call)
        ran.append((threading.current_thread().name, done))
        return done

    async def scenario() -> None:
        loop = asyncio.create_task(upkeep.maintain(db, every=0.05, keeper=Janitor(min_dead=2000, every=0.0)))
        while len(ran) < 2:
            await asyncio.sleep(0.01)
        loop.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert ran[0][1] == ["queue_state"] and ran[1][1] == []  # vacuumed once, then nothing due


def test_the_doorbell_wakes_and_lends_its_connection_only_to_answer():
    """Without `answer` it takes the ring's payload to `on_ring` and nothing else: no connection is handed
    out. With one (the dispatcher's claim on the LISTEN connection), `answer(connection, payload)` comes
    first; False falls back to `on_ring`."""
    import inspect

    rung: list[str] = []
    answered: list[tuple[bool, str]] = []
    done = threading.Event()

    def on_ring(payload: str) -> None:
        rung.append(payload)
        done.set()

    def answer(conn, payload: str) -> bool:  # noqa: ANN001
        answered.append((conn.execute("SELECT 1").fetchone() == (1,), payload))
        if payload == "taken":
            done.set()
            return True
        return False

    assert list(inspect.signature(Doorbell).parameters) == ["on_ring", "channel", "using", "application_name", "answer"]
    for kwargs, payloads in (({}, ["mine"]), ({"answer": answer}, ["taken", "declined"])):
        bell = Doorbell(on_ring, **kwargs).start()
        try:
            assert bell.connected.wait(5)
            for payload in payloads:
                done.clear()
                with autocommit_connection() as conn:
                    conn.execute("SELECT pg_notify('omnipost_queue', %s)", [payload])
                assert done.wait(5)
        finally:
            bell.stop()
    assert rung == ["mine", "declined"]
    assert answered == [(True, "taken"), (True, "declined")]


def test_delivered_event_deliveries_are_vacuumed_out_of_the_event_lanes_claim(tenant_a):
    """Every event delivery is claimed, then recorded out of event_delivery_due_idx: without VACUUM
    (autovacuum off here) the event lane's claim stepped over every delivery ever made."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO event_deliveries (tenant_id, event_id, endpoint_id, status, attempts, last_error_code) "
            "SELECT %s, gen_random_uuid(), 1, 'pending', 0, '' FROM generate_series(1, 3000)", [tenant_a.pk],
        )
        cursor.execute("UPDATE event_deliveries SET status = 'delivered', delivered_at = now()")
        cursor.execute("SELECT pg_stat_force_next_flush()")
    connection.close()

    def due_pages_read(conn: psycopg.Connection) -> int:
        with conn.transaction(force_rollback=True):
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT d.id FROM event_deliveries d "
                "WHERE d.status = 'pending' AND d.next_attempt_at <= now() "  # as events.deliveries' claim
                "ORDER BY d.next_attempt_at, d.id LIMIT 10 FOR UPDATE SKIP LOCKED"
            ).fetchone()[0][0]["Plan"]
        return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]

    with autocommit_connection() as conn:
        conn.execute("SET enable_seqscan = off")  # the claim's plan on a table of any size
        assert dead_rows(conn, "event_deliveries") >= 3000
        before = due_pages_read(conn)
        assert "event_deliveries" in Janitor(min_dead=2000).maybe_vacuum(conn)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        assert dead_rows(conn, "event_deliveries") == 0
        after = due_pages_read(conn)
    assert after * 5 < before, (before, after)


def test_a_tables_stale_statistics_are_analyzed_and_a_generic_plan_made_on_it_empty_is_made_again(tenant_a):
    """With autovacuum off, a statement prepared while a table was empty kept the plan made for that
    size (the event lane's claim read all of `event_deliveries` per claim). The janitor analyzes a
    table once more rows changed than its statistics knew of, and PostgreSQL then re-plans."""
    from psycopg._queries import PostgresQuery
    from psycopg.adapt import Transformer

    from events import deliveries, emit
    from events.services import create_endpoint
    from tests.support.outbox import fan_out

    create_endpoint(tenant_a, name="ops", url="https://hooks.example.com/e", event_types=["*"], actor="test")
    with autocommit_connection() as conn:
        conn.execute("ANALYZE event_deliveries")  # statistics of an empty table
        conn.execute("SET plan_cache_mode = force_generic_plan")  # as the dispatcher's connection
        sql, params = deliveries.claim_statement(50, 30, uuid.uuid4())
        query = PostgresQuery(Transformer(conn))
        query.convert(sql, params)
        conn.execute(f"PREPARE lane_claim AS {query.query.decode()}")
        names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))  # $1, $2, … in order of first use

        def seq_scanned() -> bool:
            explain = psycopg.ClientCursor(conn)
            explain.execute(f"EXPLAIN (FORMAT JSON) EXECUTE lane_claim({', '.join(['%s'] * len(names))})",
                            [params[name] for name in names])
            return ("Seq Scan", "event_deliveries") in plans.scans(explain.fetchone()[0][0]["Plan"])

        assert seq_scanned()  # planned for an empty table
        emit.emit(None, tenant_a.pk, "notification.delivered",
                  [{"notification_id": str(uuid.uuid4()), "status": "delivered"} for _ in range(3000)])  # fmt: skip
        assert fan_out() == 3000  # as the lane does (its own connection: no plan of `conn` changes)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        connection.close()  # the backend's statistics reach the collector as it exits
        assert wait_until(lambda: _changed_since_analyzed(conn, "event_deliveries") >= 3000, 5)
        janitor = Janitor(min_dead=10**9)  # nothing to vacuum
        assert janitor.maybe_vacuum(conn) == []
        assert "event_deliveries" in janitor.analyzed and "events" in janitor.analyzed
        assert _changed_since_analyzed(conn, "event_deliveries") == 0
        assert not seq_scanned()  # the same prepared statement, planned again
        again = Janitor(min_dead=10**9)
        again.maybe_vacuum(conn)
        assert "event_deliveries" not in again.analyzed  # fresh: not analyzed again


def _changed_since_analyzed(conn: psycopg.Connection, table: str) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = %s", [table]).fetchone()
    return row[0]


def brin_heap_blocks(conn: psycopg.Connection) -> int:
    """Heap blocks the last hour's count reads through brin_look_at (in a rolled-back transaction)."""
    with conn.transaction(force_rollback=True):
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM brin_look WHERE at >= now() - interval '1 hour'"
        ).fetchone()[0][0]["Plan"]
    scan = plan["Plans"][0]
    assert scan["Node Type"] == "Bitmap Heap Scan", plan
    return scan.get("Lossy Heap Blocks", 0) + scan.get("Exact Heap Blocks", 0)


@pytest.mark.timeout(60)
def test_a_look_summarises_the_full_block_ranges_of_brin_indexes_and_leaves_the_partial_one():
    """A BRIN index's inserts write nothing to it (delivery_attempts' attempt_finished_idx): until its ranges
    are summarised, a scan for the last hour reads the whole table. A look of the janitor summarises the full
    ranges of the tables whose rows changed, not the last partial one (each insert would then rewrite its
    summary), and waits for no VACUUM that holds the table."""
    with autocommit_connection() as conn:
        conn.execute("CREATE TABLE brin_look (at timestamptz NOT NULL, pad text NOT NULL)")
        conn.execute("CREATE INDEX brin_look_at ON brin_look USING brin (at) WITH (pages_per_range = 16)")
        conn.execute("SELECT brin_desummarize_range('brin_look_at', 0)")  # as core.partitions leaves a new one
        try:
            conn.execute("INSERT INTO brin_look SELECT now() - interval '1 day' + g * interval '1 second', "
                         "repeat('x', 200) FROM generate_series(1, 20000) g")  # fmt: skip
            conn.execute("ANALYZE brin_look")
            conn.execute("INSERT INTO brin_look SELECT now() - g * interval '1 second', '' "
                         "FROM generate_series(1, 5) g")  # fmt: skip
            conn.execute("SELECT pg_stat_force_next_flush()")
            pages = conn.execute("SELECT pg_relation_size('brin_look') / 8192").fetchone()[0]
            assert brin_heap_blocks(conn) > pages * 0.9  # nothing summarised: (nearly) every block is read

            with autocommit_connection() as holder, holder.transaction():
                holder.execute("LOCK TABLE brin_look IN SHARE UPDATE EXCLUSIVE MODE")  # as a VACUUM does
                assert janitor.summarize_brin(conn, ["brin_look"]) == 0
            look = Janitor(every=0.0)
            conn.execute("SELECT pg_stat_clear_snapshot()")
            look.maybe_vacuum(conn)
            assert look.summarized == pages // 16
            # the hour is in the last block or two: only the partial range is read whole
            assert brin_heap_blocks(conn) <= 16 + pages % 16
            assert janitor.summarize_brin(conn, ["brin_look"]) == 0  # done once
        finally:
            conn.execute("DROP TABLE brin_look")
