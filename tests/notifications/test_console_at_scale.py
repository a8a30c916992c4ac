"""The console and `GET queues` at 200,000 notifications: no page reads a whole table.

Every statement a page runs is captured and run again under EXPLAIN (ANALYZE, FORMAT JSON): no
sequential scan of `notifications` or `queue_state`, no scan that throws away more than a page's worth
of rows by filter, and no scan of `notifications` that reads more than page 200's window. As a superuser
and as a staff member of one tenant (made by `create_staff_user`), over a backlog big enough (60,000 live
items) that the queue figures take their sampled path.
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from notifications.models import Notification
from queueing import stats
from tests import factories
from tests.conftest import client_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BIG = ("notifications", "queue_state", "dead_letter_queue", "delivery_attempts", "notification_events")
# Rows a scan may discard by filter: a constant, plus twice what it keeps: a scan's cost follows the page
# window it serves, never the table. (Two places need the multiple. Tenant A holds three rows in four,
# and for its staff PostgreSQL reads notif_created_idx, which looks sequential on disk, and drops tenant
# B's quarter rather than walk notif_tenant_recent_idx; it turns to that index as a tenant's share
# falls. The delivered filter reads the created_at indexes: delivered rows stay out of the status
# indexes, so recording a delivery writes none of them.)
MAX_REMOVED = 2_000
KEEP_RATIO = 2
# A sample of queue_state, filtered to one tenant, discards the other tenants' items of the sampled pages.
MAX_SAMPLE_ROWS = stats.SAMPLE_PAGES * 200
# Rows a scan of notifications may produce: page 200 (of 50 rows) walks 10,000 index entries, and a capped
# count at most 10,001.
MAX_NOTIFICATION_ROWS = 10_100

# (status, share of 200): 120,000 delivered, a backlog of 50,000 queued and 10,000 retrying (live
# queue items), and the rest in the statuses an operator filters for.
MIX = [("delivered", 120), ("queued", 50), ("retrying", 10), ("failed", 6), ("dead_lettered", 6),
       ("cancelled", 4), ("scheduled", 4)]  # fmt: skip


def fill(tenant_a, tenant_b, prov_a, prov_b) -> None:  # noqa: ANN001
    """200,000 notifications over 30 days (three in four tenant A's), their live queue items, a
    dead-letter entry for each failed or dead-lettered one (the record writes one for both; one in twenty
    still open, as in a DLQ whose operators keep up, so the open filter is selective) and a pending
    job for each scheduled one, in a few INSERT … SELECT statements."""
    token = Notification._meta.get_field("recipient").get_prep_value("https://example.test/h")
    cases = " ".join(
        f"WHEN g %% 200 < {sum(n for _, n in MIX[: i + 1])} THEN '{status}'" for i, (status, _) in enumerate(MIX)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
                subject, body, priority, queue, status, metadata, attempt_count, attempt_offset, last_error_code,
                created_at, updated_at)
            SELECT gen_random_uuid(), CASE WHEN g %% 4 = 0 THEN %s ELSE %s END, 'webhook', %s, 'h***',
                   CASE WHEN g %% 4 = 0 THEN %s ELSE %s END, '{{}}', 's', 'b', g %% 10,
                   CASE WHEN g %% 7 = 0 THEN 'bulk' ELSE 'default' END,
                   CASE {cases} END, '{{}}', 1, 0, '', now() - (g * interval '13 seconds'), now()
            FROM generate_series(1, 200000) AS g
            """,  # noqa: S608 - the CASE is built from the constants above
            [tenant_b.pk, tenant_a.pk, token, prov_b.pk, prov_a.pk],
        )
        cursor.execute(
            """
            INSERT INTO queue_state (queue_name, priority, payload_json, enqueued_at, available_at, attempts,
                                     tenant_id, notification_id, provider_id, rate_limited, ready)
            SELECT queue, priority, '{}'::jsonb, created_at, CASE WHEN status = 'retrying' THEN now() + interval
                   '1 hour' ELSE created_at END, 0, tenant_id, id, provider_id, false, status = 'queued'
            FROM notifications WHERE status IN ('queued', 'retrying')
            """
        )
        cursor.execute(
            """
            INSERT INTO dead_letter_queue (id, notification_id, tenant_id, provider_id, failure_reason, failure_class,
                error_code, last_status_code, attempt_count, status, created_at, resolved_by)
            SELECT gen_random_uuid(), id, tenant_id, provider_id, 'HTTP 503', 'transient', 'http_503', 503, 8,
                   CASE WHEN random() < 0.95 THEN 'redriven' ELSE 'open' END, created_at, ''
            FROM notifications WHERE status IN ('failed', 'dead_lettered')
            """
        )
        cursor.execute(
            """
            INSERT INTO scheduled_jobs (job_id, tenant_id, notification_id, run_at, status, created_at)
            SELECT gen_random_uuid(), tenant_id, id, now() + interval '1 day', 'pending', created_at
            FROM notifications WHERE status = 'scheduled'
            """
        )
        # Receipts: half the delivered ones reported delivered, one in fifty of the rest bounced hard,
        # each with its event.
        cursor.execute(
            """
            UPDATE notifications SET receipt = CASE WHEN random() < 0.04 THEN 'bounced' ELSE 'delivered' END
            WHERE status = 'delivered' AND random() < 0.5
            """
        )
        cursor.execute("UPDATE notifications SET bounce_type = 'hard' WHERE receipt = 'bounced'")
        cursor.execute(
            """
            INSERT INTO notification_events (tenant_id, notification_id, provider_id, type, receipt, bounce_type,
                                             occurred_at, details, created_at)
            SELECT tenant_id, id, provider_id, receipt, receipt, bounce_type, created_at + interval '3 seconds',
                   '{"code": "250"}'::jsonb, now()
            FROM notifications WHERE receipt IS NOT NULL
            """
        )
        # Indexes sized for these rows: rows that earlier tests rolled back leave btree pages that no
        # vacuum gives back, and the planner prices an index scan by the index's pages per entry (with
        # 600,000 such rows behind it, queue_state's partial indexes lost to a sequential scan).
        # REINDEX TABLE is transactional (the rollback restores the old files); it refuses a partitioned
        # table in a transaction (delivery_attempts, notification_events).
        for table in BIG:
            if table in ("notifications", "queue_state", "dead_letter_queue"):
                cursor.execute(f"REINDEX TABLE {table}")
            cursor.execute(f"ANALYZE {table}")


@pytest.fixture
def console_at_scale(db, tenant_a, tenant_b) -> Iterator[dict[str, Any]]:  # noqa: ANN001
    prov_a, prov_b = factories.provider(tenant_a, "hook-a"), factories.provider(tenant_b, "hook-b")
    fill(tenant_a, tenant_b, prov_a, prov_b)
    yield {"prov_a": prov_a}
    # ANALYZE writes pg_class in place, outside the transaction: leave sizes that match the rollback,
    # or the next test's handful of queue items would be sampled.
    with connection.cursor() as cursor:
        for table in ("queue_state", "dead_letter_queue", "scheduled_jobs", "notification_events", "notifications"):
            cursor.execute(f"DELETE FROM {table}")  # noqa: S608
            cursor.execute(f"ANALYZE {table}")


def sampling_error() -> float:
    """Four standard deviations of the sampled depth, relative: TABLESAMPLE SYSTEM keeps each page with
    probability p = SAMPLE_PAGES / pages, and of the L pages that hold live items about pL are kept
    (sd sqrt((1 - p) / (p L)) of the count). The rows that earlier tests rolled back stay in the file
    as dead pages until a VACUUM, which the transaction this test runs in cannot run: p is smaller here
    than on a table the janitor keeps vacuumed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_relation_size('queue_state') / current_setting('block_size')::int,"
            " count(DISTINCT (ctid::text::point)[0]) FROM queue_state"
        )
        pages, live_pages = cursor.fetchone()
    p = min(1.0, stats.SAMPLE_PAGES / max(1, pages))
    return 4 * ((1 - p) / (p * live_pages)) ** 0.5


def staff_client(monkeypatch: pytest.MonkeyPatch) -> Client:
    monkeypatch.setattr(sys, "stdin", io.StringIO("console-Pa55word-42\n"))
    call_command("create_staff_user", "ops-a", "--tenant", "tenant-a", "--password-stdin", stdout=io.StringIO())
    client = Client()
    client.force_login(get_user_model().objects.get(username="ops-a"))
    return client


def superuser_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.test", "x"))
    return client


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def faults(sql: str) -> list[str]:
    """What is wrong with one statement's executed plan (EXPLAIN ANALYZE runs it once more)."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
        plan = json.loads(plan) if isinstance(plan, str) else plan
    found = []
    for node in nodes(plan[0]["Plan"]):
        table = node.get("Relation Name")
        if table not in BIG:
            continue
        kind, loops = node["Node Type"], node.get("Actual Loops", 1)
        removed = (node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)) * loops
        if kind == "Seq Scan" and table in ("notifications", "queue_state"):
            found.append(f"Seq Scan on {table}")
        kept = node["Actual Rows"] * loops
        allowed = MAX_SAMPLE_ROWS if kind == "Sample Scan" else MAX_REMOVED + KEEP_RATIO * kept
        if removed > allowed:
            found.append(f"{kind} on {table} removed {removed:,} rows by filter")
        if table == "notifications" and kept > MAX_NOTIFICATION_ROWS:
            found.append(f"{kind} on notifications produced {kept:,} rows")
    return found


def statements(context: CaptureQueriesContext) -> list[str]:
    """The captured reads (EXPLAIN: the planner's estimate for a capped count, which reads nothing)."""
    return [q["sql"] for q in context.captured_queries if q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))]


def check_page(client: Client, url: str, expect: str | None = None) -> list[str]:
    with CaptureQueriesContext(connection) as context:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    if expect is not None:
        assert expect in response.content.decode(), (url, expect)
    found = [f"{url}: {fault}\n    {sql[:300]}" for sql in statements(context) for fault in faults(sql)]
    return found


def test_console_pages_and_get_queues_never_scan_a_whole_table(console_at_scale, tenant_a, key_a, monkeypatch):
    failed = Notification.objects.filter(tenant=tenant_a, status="failed").order_by("-created_at").first()
    theirs = Notification.objects.exclude(tenant=tenant_a).order_by("-created_at").first()
    bounced = Notification.objects.filter(tenant=tenant_a, receipt="bounced").order_by("-created_at").first()
    cases = [
        ("/admin/notifications/notification/", None),
        (f"/admin/notifications/notification/?q={failed.pk}", str(failed.pk)),
        ("/admin/notifications/notification/?status=failed", "failed"),
        ("/admin/notifications/notification/?status=queued", "queued"),
        ("/admin/notifications/notification/?status=retrying", "retrying"),
        ("/admin/notifications/notification/?status=dispatching", "dispatching"),
        ("/admin/notifications/notification/?status=scheduled", "scheduled"),
        ("/admin/notifications/notification/?status=dead_lettered", "dead_lettered"),
        ("/admin/notifications/notification/?status=failed&p=2", "failed"),
        ("/admin/notifications/notification/?status=delivered", "delivered"),
        ("/admin/notifications/notification/?p=200", None),
        (f"/admin/notifications/notification/{failed.pk}/change/", str(failed.pk)),
        ("/admin/notifications/notification/?receipt=bounced", "Bounced"),
        # A rare receipt reads notif_receipt_idx / notif_tenant_receipt_idx; a common one (delivered) the
        # created_at indexes, like the delivered status, at a cost of page / its share of the rows.
        ("/admin/notifications/notification/?receipt=bounced&p=2", None),
        ("/admin/notifications/notification/?receipt=bounced&status=delivered", None),
        (f"/admin/notifications/notification/{bounced.pk}/change/", "Receipt events"),
        ("/admin/dlq/deadletter/", None),
        ("/admin/dlq/deadletter/?status=all", None),
        ("/admin/dashboard/", "Queue depth"),
    ]
    problems = []
    root = superuser_client()
    for role, client in (("superuser", root), ("staff", staff_client(monkeypatch))):
        for url, expect in cases:
            problems += [f"[{role}] {f}" for f in check_page(client, url, expect)]
        # Staff of tenant A find nothing of tenant B's, even by its exact id.
        if role == "staff":
            response = client.get(f"/admin/notifications/notification/?q={theirs.pk}")
            assert list(response.context["cl"].result_list) == []
        # Cancelled notifications have no live row: the filter reads the newest CappedCountPaginator.cap
        # notifications and keeps the cancelled ones, a bound of its own (twice the cap: tenant A's staff
        # read notif_created_idx, see MAX_REMOVED, and drop tenant B's rows of the window too).
        found = check_page(client, "/admin/notifications/notification/?status=cancelled", "cancelled")
        bounded = re.compile(r"Index Scan on notifications removed ([\d,]+) rows by filter")
        problems += [
            f"[{role}] {f}"
            for f in found
            if not ((m := bounded.search(f)) and int(m[1].replace(",", "")) <= 2 * stats.CappedCountPaginator.cap)
        ]
    api = client_for(key_a)
    with CaptureQueriesContext(connection) as context:
        response = api.get("/api/v1/queues")
    assert response.status_code == 200
    problems += [f"GET queues: {f}" for sql in statements(context) for f in faults(sql)]
    assert not problems, "\n".join(problems)

    # The backlog (60,000 live items, 45,000 of them tenant A's) is past EXACT_ROWS: figures are sampled.
    figures, exact = stats.queue_figures_sized()
    assert not exact
    within = sampling_error()
    depth = sum(q["depth"] for q in figures)
    assert abs(depth - 60_000) <= within * 60_000, (depth, within)
    mine = {q["queue"]: q for q in response.json()["results"]}
    assert abs(sum(q["depth"] for q in mine.values()) - 45_000) <= within * 45_000, within
    delayed = sum(q["delayed"] for q in mine.values())  # the retrying ones wait an hour
    assert 4_000 * (1 - within) <= delayed <= 11_000 * (1 + within), (delayed, within)
    # The oldest ready item (in `default` or `bulk`: created 30 days ago) is read exactly for everyone.
    assert max(q["oldest_age_seconds"] for q in figures) > 25 * 86_400

    # The pages these plans come from are the right ones: only that status, newest first; a search
    # term that is no UUID finds nothing.
    client = root
    for status in ("cancelled", "queued", "retrying", "failed", "dead_lettered", "scheduled", "delivered"):
        rows = client.get(f"/admin/notifications/notification/?status={status}").context["cl"].result_list
        assert len(rows) == 50 and {r.status for r in rows} == {status}, status
        assert [r.created_at for r in rows] == sorted((r.created_at for r in rows), reverse=True), status
    rows = client.get("/admin/notifications/notification/?receipt=bounced").context["cl"].result_list
    assert len(rows) == 50 and {r.receipt for r in rows} == {"bounced"}
    assert [r.created_at for r in rows] == sorted((r.created_at for r in rows), reverse=True)
    newest_queued = Notification.objects.filter(status="queued").order_by("-created_at").first()
    rows = client.get("/admin/notifications/notification/?status=queued").context["cl"].result_list
    assert rows[0].pk == newest_queued.pk
    assert list(client.get("/admin/notifications/notification/?q=not-a-uuid").context["cl"].result_list) == []
