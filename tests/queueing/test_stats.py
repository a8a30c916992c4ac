"""queueing.stats: the queue figures, throughput, DLQ size, estimates and workers behind `GET queues`
and the console dashboard — one query each, tenant-scoped, and index-served at scale."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now

from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt
from omnipost_site.ops import figures as ops_figures
from queueing import stats
from queueing.models import QueueItem, Worker
from tests import factories
from tests.dlq.test_services import bulk_dead_letters_sql, dead_letters

pytestmark = pytest.mark.django_db


@pytest.fixture
def hook_a(tenant_a):  # noqa: ANN001, ANN201
    return factories.provider(tenant_a, "hook-a")


def test_queue_figures_by_queue_and_priority_in_one_query(tenant_a, tenant_b, hook_a, django_assert_num_queries):
    factories.queued(tenant_a, hook_a, 3, priority=9, queue_name="alerts")
    factories.queued(tenant_a, hook_a, 2, priority=5, queue_name="default")
    delayed = factories.queued(tenant_a, hook_a, 1, priority=5, queue_name="default", delay=300)
    factories.queued(tenant_b, factories.provider(tenant_b, "hook-b"), 4, priority=1, queue_name="default")
    leased = QueueItem.objects.filter(queue_name="alerts").first()
    QueueItem.objects.filter(pk=leased.pk).update(lock_token=uuid.uuid4(), locked_until=Now() + timedelta(seconds=30),
                                                  available_at=Now() + timedelta(seconds=30))  # fmt: skip
    QueueItem.objects.filter(queue_name="alerts").exclude(pk=leased.pk).update(enqueued_at=Now() - timedelta(minutes=2))
    with django_assert_num_queries(1):
        figures = {q["queue"]: q for q in stats.queue_figures()}
    alerts, default = figures["alerts"], figures["default"]
    assert (alerts["depth"], alerts["ready"], alerts["leased"], alerts["delayed"]) == (3, 2, 1, 0)
    assert 119 <= alerts["oldest_age_seconds"] <= 125
    assert alerts["by_priority"] == {**{str(p): 0 for p in range(10)}, "9": 3}
    assert (default["depth"], default["ready"], default["delayed"]) == (7, 6, 1)
    assert default["by_priority"]["5"] == 3 and default["by_priority"]["1"] == 4
    mine = {q["queue"]: q for q in stats.queue_figures([tenant_a.pk])}
    assert mine["default"]["depth"] == 3 and mine["default"]["by_priority"]["1"] == 0
    assert stats.queue_figures([]) == []
    total = stats.totals(list(figures.values()))
    assert (total["depth"], total["ready"], total["leased"], total["delayed"]) == (10, 8, 1, 1)
    assert total["by_priority"]["5"] == 3 and total["oldest_age_seconds"] == alerts["oldest_age_seconds"]
    assert delayed  # the delayed one is waiting for backoff, not ready


def test_throughput_per_minute_over_the_last_hour_in_one_query(tenant_a, tenant_b, hook_a, django_assert_num_queries):
    (note,) = factories.notifications(tenant_a, hook_a, 1)
    (other,) = factories.notifications(tenant_b, factories.provider(tenant_b, "hook-b"), 1)
    now = datetime.now(UTC).replace(second=30, microsecond=0)
    rows = [(note, now - timedelta(minutes=m), outcome) for m, outcome in
            [(0, "delivered"), (0, "delivered"), (0, "transient_error"), (5, "permanent_error"), (59, "delivered"),
             (61, "delivered"), (180, "delivered")]]  # fmt: skip
    rows.append((other, now, "delivered"))
    DeliveryAttempt.objects.bulk_create(
        [DeliveryAttempt(tenant_id=n.tenant_id, notification=n, number=i + 1, started_at=t, finished_at=t, outcome=o)
         for i, (n, t, o) in enumerate(rows)]  # fmt: skip
    )
    with django_assert_num_queries(1):
        minutes = ops_figures.throughput([tenant_a.pk], now=now)
    assert len(minutes) == 60 and minutes[-1].start == now.replace(second=0)
    assert minutes[0].start == now.replace(second=0) - timedelta(minutes=59)
    assert (minutes[-1].delivered, minutes[-1].transient, minutes[-1].failed) == (2, 1, 1)
    assert minutes[-6].permanent == 1 and minutes[0].delivered == 1
    assert sum(m.delivered for m in minutes) == 3  # 61 and 180 minutes ago are outside the hour
    assert sum(m.delivered for m in ops_figures.throughput(now=now)) == 4  # every tenant


def test_dlq_open_is_exact_up_to_the_cap_then_an_estimate(tenant_a, tenant_b, hook_a):
    dead_letters(tenant_a, hook_a, 7)
    dead_letters(tenant_b, factories.provider(tenant_b, "hook-b"), 2)
    DeadLetter.objects.filter(pk__in=DeadLetter.objects.filter(tenant=tenant_a).values("pk")[:1]).update(status="discarded")
    assert ops_figures.dlq_open() == stats.Size(8, True)
    assert ops_figures.dlq_open([tenant_b.pk]).count == 2
    capped = ops_figures.dlq_open(cap=3)
    assert not capped.exact and capped.count >= 4 and str(capped).startswith("≈")
    assert str(stats.Size(1234, True)) == "1,234"


def test_estimates_come_from_the_planner(tenant_a, hook_a):
    factories.queued(tenant_a, hook_a, 50)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notifications")
    assert stats.estimated_rows("notifications") == 50
    assert stats.estimated_rows("no_such_table") is None
    assert stats.planner_estimate(QueueItem.objects.all()) > 0


def test_capped_count_paginator(tenant_a, hook_a, monkeypatch):
    factories.queued(tenant_a, hook_a, 12)
    monkeypatch.setattr(stats.CappedCountPaginator, "cap", 20)
    assert stats.CappedCountPaginator(QueueItem.objects.order_by("pk"), 5).count == 12
    monkeypatch.setattr(stats.CappedCountPaginator, "cap", 10)
    assert stats.CappedCountPaginator(QueueItem.objects.order_by("pk"), 5).count >= 11


def test_workers_are_flagged_live_or_stale(settings):
    settings.OMNIPOST_WORKER_STALE_SECONDS = 30
    live = Worker.objects.create(kind="dispatcher", host="a", pid=1)
    stale = Worker.objects.create(kind="dispatcher", host="b", pid=2)
    Worker.objects.filter(pk=stale.pk).update(last_seen=Now() - timedelta(minutes=5))
    stopped = Worker.objects.create(kind="scheduler", host="c", pid=3)
    Worker.objects.filter(pk=stopped.pk).update(stopped_at=Now())
    rows = {r.worker.pk: r for r in stats.workers()}
    assert set(rows) == {live.pk, stale.pk}
    assert rows[live.pk].alive and not rows[stale.pk].alive and rows[stale.pk].seen_seconds_ago >= 299


def _nodes(plan: object) -> list[dict]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, list):
        return [n for item in plan for n in _nodes(item)]
    if isinstance(plan, dict):
        found = [plan] if "Node Type" in plan else []
        return found + [n for key in ("Plan", "Plans") if key in plan for n in _nodes(plan[key])]
    return []


def _plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        return json.dumps(cursor.fetchone()[0])


@pytest.fixture
def drained_stats(analysed_tables):  # noqa: ANN001, ANN201
    """The bulk test's queue sizes must not make queue_figures sample the next test's few items, and
    the pages earlier tests' rolled-back rows left in queue_state (autovacuum is off here) must not
    dilute its sample: a VACUUM on a connection of its own, before this test writes anything, removes
    them (rows of aborted transactions are dead to every snapshot)."""
    import psycopg

    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"],
                         password=db["PASSWORD"], dbname=db["NAME"], autocommit=True) as own:  # fmt: skip
        own.execute("VACUUM queue_state")
    analysed_tables.add("queue_state")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dashboard_figures_stay_index_served_at_scale(
    drained_stats, tenant_a, tenant_b, hook_a, django_assert_max_num_queries
):
    """150,000 notifications with old attempts and 50,000 dead letters (1,000 still open): the hour's
    throughput reads attempt_finished_idx, the DLQ size a (status, created_at) index, and no figure counts
    a whole table."""
    factories.bulk_queued_sql(tenant_b, factories.provider(tenant_b, "hook-b"), 100_000)
    bulk_dead_letters_sql(tenant_a, hook_a, 50_000)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at, finished_at,
                outcome, error_class, error_code, error_message, duration_ms)
            SELECT tenant_id, id, 1, provider_id, now() - interval '2 days', now() - interval '2 days', 'delivered',
                   '', '', '', 5
            FROM notifications
            """
        )
        # Statistics first (autovacuum is off here): without them the planner nests a scan of the 50,000
        # entries inside the semi-join below, for every entry.
        cursor.execute("ANALYZE dead_letter_queue")
        cursor.execute(  # most entries were dealt with long ago
            "UPDATE dead_letter_queue SET status = 'redriven' "
            "WHERE id IN (SELECT id FROM dead_letter_queue LIMIT 49000)"
        )
        for table in ("notifications", "delivery_attempts", "dead_letter_queue", "queue_state"):
            cursor.execute(f"ANALYZE {table}")
    with django_assert_max_num_queries(5):
        figures = stats.queue_figures()
        minutes = ops_figures.throughput()
        size = ops_figures.dlq_open()
        estimate = stats.estimated_rows("notifications")
        workers = stats.workers()
    # 100,000 items fill more than SAMPLE_PAGES pages: the figures are a scaled sample (shown with "≈"), within a
    # third.
    assert 66_000 <= figures[0]["depth"] <= 134_000 and not stats.queue_figures_sized()[1]
    assert sum(m.delivered for m in minutes) == 0 and workers == []
    assert size == stats.Size(1_000, True)
    assert 120_000 <= estimate <= 180_000
    hour = _plan("SELECT count(*) FROM delivery_attempts WHERE finished_at >= now() - interval '1 hour'", [])
    # delivery_attempts is partitioned by day (core.partitions): the hour's partitions and the default one
    # (where these two-day-old rows are, the test database having day partitions from today on) are read,
    # the 150,000 rows through their attempt_finished_idx; only the empty day partitions are scanned whole.
    scans = {node["Relation Name"]: node["Node Type"] for node in _nodes(json.loads(hour)) if "Relation Name" in node}
    assert scans.pop("delivery_attempts_default") in ("Index Only Scan", "Index Scan", "Bitmap Heap Scan"), hour
    assert "attempt_finished_idx_default" in hour
    assert scans and all(name.startswith("delivery_attempts_p") for name in scans), scans
    open_entries = _plan("SELECT count(*) FROM dead_letter_queue WHERE status = 'open' AND tenant_id = %s",
                         [tenant_a.pk])  # fmt: skip
    assert "dlq_" in open_entries
