"""Day partitions of the history tables (core.partitions): created ahead with a default partition,
rows of the real record statements in the partition of their day, a plain table converted with its
rows, and the scheduler's hourly upkeep."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from core import partitions
from dispatch.dispatcher import Dispatcher, DispatcherConfig
from notifications.models import DeliveryAttempt
from receipts.services import apply_receipts
from tests import factories
from tests.receipts.conftest import SECRET_A, receipt, side
from tests.support.receivers import TEST_SIGNING_SECRET

TABLES = {"delivery_attempts": "finished_at", "notification_events": "occurred_at"}


def today() -> date:
    return datetime.now(UTC).date()


def children(table: str) -> dict[str, str]:
    """{partition: bound expression} straight from pg_inherits / pg_class."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [table],
        )
        return dict(cursor.fetchall())


def home(table: str, where: str = "true") -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {where} ORDER BY id")  # noqa: S608
        return [r[0] for r in cursor.fetchall()]


@pytest.mark.django_db
def test_migrate_left_both_tables_partitioned_by_day_from_today_on_with_a_default():
    assert partitions.partitioned_tables() == TABLES
    for table in TABLES:
        made = children(table)
        for offset in range(partitions.DAYS_AHEAD + 1):
            day = today() + timedelta(days=offset)
            bound = made[partitions.day_name(table, day)]
            assert bound == (f"FOR VALUES FROM ('{day:%Y-%m-%d} 00:00:00+00') TO "
                             f"('{day + timedelta(days=1):%Y-%m-%d} 00:00:00+00')")  # fmt: skip
        assert made[partitions.default_name(table)] == "DEFAULT"
        assert partitions.ensure(table) == []  # nothing missing: nothing made


@pytest.mark.django_db
def test_ensure_makes_the_days_ahead_of_a_later_today_and_moves_their_rows_out_of_the_default(tenant_a):
    hook = factories.provider(tenant_a, "hook")
    note = factories.notifications(tenant_a, hook, 1, status="delivered")[0]
    later = today() + timedelta(days=30)
    at = partitions.day_start(later) + timedelta(hours=5)
    DeliveryAttempt.objects.create(tenant=tenant_a, notification=note, number=1, provider=hook, started_at=at,
                                   finished_at=at, outcome="delivered")  # fmt: skip
    # no partition covers that day yet: the insert did not fail, the row waits in the default partition
    assert home("delivery_attempts") == ["delivery_attempts_default"]

    made = partitions.ensure("delivery_attempts", today=later)

    assert made == [partitions.day_name("delivery_attempts", later + timedelta(days=i)) for i in range(8)]
    assert home("delivery_attempts") == [partitions.day_name("delivery_attempts", later)]
    bounds = {p.name: (p.lower, p.upper) for p in partitions.partitions("delivery_attempts")}
    assert bounds[made[0]] == (partitions.day_start(later), partitions.day_start(later + timedelta(days=1)))
    # the partition carries the parent's indexes under names that say which they are
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s ORDER BY 1", [made[0]])
        suffix = made[0].removeprefix("delivery_attempts_")
        assert [r[0] for r in cursor.fetchall()] == [
            f"attempt_finished_idx_{suffix}", f"attempt_number_unique_{suffix}",
        ]  # fmt: skip
    assert DeliveryAttempt.objects.get().finished_at == at  # still read through the parent
    # its BRIN index starts with no summary (inserts write nothing to it until the janitor summarises)
    DeliveryAttempt.objects.create(tenant=tenant_a, notification=note, number=2, provider=hook, started_at=at,
                                   finished_at=at + timedelta(days=1), outcome="delivered")  # fmt: skip
    with connection.cursor() as cursor:
        index = f"attempt_finished_idx_{made[1].removeprefix('delivery_attempts_')}"
        cursor.execute("SELECT brin_summarize_new_values(%s::regclass)", [index])
        assert cursor.fetchone()[0] == 1


@pytest.mark.django_db(transaction=True)
def test_the_dispatchers_record_statement_puts_each_attempt_in_the_partition_of_its_day(
    tenant_a, webhook_receiver
):  # fmt: skip
    hook = factories.provider(tenant_a, config={"url": webhook_receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET})  # fmt: skip
    day = today() + timedelta(days=3)
    factories.queued(tenant_a, hook, 6)
    # the attempt's timestamps are the worker's clock (the leases are the database's)
    with time_machine.travel(partitions.day_start(day) + timedelta(hours=12), tick=True):
        assert Dispatcher(DispatcherConfig(once=True, jitter=False, batch_size=4)).run() == 0
    assert webhook_receiver.wait_for(6)
    assert home("delivery_attempts") == [partitions.day_name("delivery_attempts", day)] * 6
    assert DeliveryAttempt.objects.filter(outcome="delivered").count() == 6


@pytest.mark.django_db
def test_receipt_events_land_in_the_partition_of_their_occurred_at_or_the_default(tenant_a):
    ours = side(tenant_a, SECRET_A)
    when = {
        "today": partitions.day_start(today()) + timedelta(minutes=1),
        "ahead": partitions.day_start(today() + timedelta(days=2)) + timedelta(hours=23),
        "long_ago": datetime(2020, 1, 1, tzinfo=UTC),  # a vendor's clock far off: no partition, no failure
    }
    result = apply_receipts(ours.view, [receipt(note, "delivered", at=at)
                                        for note, at in zip(ours.notes, when.values(), strict=True)])  # fmt: skip
    assert result.applied == 3
    assert home("notification_events") == [
        partitions.day_name("notification_events", today()),
        partitions.day_name("notification_events", today() + timedelta(days=2)),
        "notification_events_default",
    ]


@pytest.mark.django_db
def test_convert_moves_a_plain_tables_rows_into_day_partitions_and_keeps_its_ids_going():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE scratch_history (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "
                       "at timestamptz NOT NULL, what text NOT NULL)")  # fmt: skip
        cursor.execute("CREATE INDEX scratch_what_idx ON scratch_history (what)")
        cursor.execute("INSERT INTO scratch_history (at, what) SELECT now() - g * interval '1 day', 'row ' || g "
                       "FROM generate_series(0, 4) g")  # fmt: skip
    with connection.schema_editor() as editor:
        partitions.convert(editor, "scratch_history", "at", primary_key=["id", "at"],
                           indexes=["CREATE INDEX scratch_what_idx ON scratch_history (what)"])  # fmt: skip
    assert partitions.partitioned_tables()["scratch_history"] == "at"
    days = [today() - timedelta(days=g) for g in range(5)]
    assert home("scratch_history") == [partitions.day_name("scratch_history", d) for d in days]
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO scratch_history (at, what) VALUES (now(), 'new') RETURNING id")
        assert cursor.fetchone()[0] == 6
        cursor.execute("SELECT to_regclass('scratch_history_unpartitioned')")
        assert cursor.fetchone()[0] is None
    assert set(children("scratch_history")) == (
        {partitions.day_name("scratch_history", today() - timedelta(days=g)) for g in range(-7, 5)}
        | {"scratch_history_default"}
    )


@pytest.mark.django_db
def test_the_schedulers_upkeep_makes_a_missing_partition_at_most_once_an_hour():
    last = partitions.day_name("delivery_attempts", today() + timedelta(days=partitions.DAYS_AHEAD))
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {last}")
    now = [1000.0]
    keep = partitions.KeepAhead(every=3600, clock=lambda: now[0])
    assert keep() == [last]
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {last}")
    now[0] += 3599
    assert keep() == []  # not looked at yet
    now[0] += 1
    assert keep() == [last]
    assert last in children("delivery_attempts")


def _scans(node: dict) -> list[tuple[str, int]]:
    """(relation, actual loops) of every scan under an EXPLAIN (ANALYZE, FORMAT JSON) plan node."""
    found = [(node["Relation Name"], node.get("Actual Loops", 0))] if "Relation Name" in node else []
    for child in node.get("Plans", []):
        found += _scans(child)
    return found


def test_the_detail_read_prunes_the_days_before_its_notification(tenant_a):
    """GET notifications/{id} reads its attempts without probing the partitions of days before the
    notification was created (run-time pruning on `finished_at >= created_at - 1 day`)."""
    from notifications import reads

    partitions.ensure("delivery_attempts", start=today() - timedelta(days=20))
    [n] = factories.notifications(tenant_a, factories.provider(tenant_a, "hook"), 1)
    now = datetime.now(UTC)
    DeliveryAttempt.objects.create(tenant=tenant_a, notification=n, number=1, started_at=now, finished_at=now,
                                   outcome="success")  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) " + reads._sql(), [n.pk, tenant_a.pk])
        [root] = cursor.fetchone()[0]
    loops = {name: count for name, count in _scans(root["Plan"]) if name.startswith("delivery_attempts")}
    old = {partitions.day_name("delivery_attempts", today() - timedelta(days=d)) for d in range(2, 21)}
    assert partitions.day_name("delivery_attempts", today()) in loops  # the plan does reach the partitions
    assert not {name for name in old if loops.get(name, 0) > 0}, loops
