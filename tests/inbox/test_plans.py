"""A feed page and the counts read only the subscriber's rows: the partial indexes led by (tenant,
subscriber) in the feed's order, whatever else the table holds."""

from __future__ import annotations

import pytest
from django.db import connection

from inbox.models import InboxItem

pytestmark = pytest.mark.django_db

FILL = """
    INSERT INTO inbox_items (id, tenant_id, subscriber, notification_id, category, title, body, data, action_url,
                             created_at, seen_at, read_at, archived_at)
    SELECT gen_random_uuid(), %s, 'user-' || (g %% 500), gen_random_uuid(), 'general', 't', 'b', '{}', '',
           now() - g * interval '1 second',
           CASE WHEN g %% 3 = 0 THEN now() END, CASE WHEN g %% 5 = 0 THEN now() END,
           CASE WHEN g %% 7 = 0 THEN now() END
    FROM generate_series(1, 20000) g"""


def plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.parametrize(
    ("where", "index"),
    [
        ("archived_at IS NULL", "inbox_feed_idx"),
        ("archived_at IS NOT NULL", "inbox_archived_idx"),
        ("archived_at IS NULL AND read_at IS NULL", "inbox_unread_idx"),
        ("archived_at IS NULL AND seen_at IS NULL", "inbox_unseen_idx"),
    ],
)
def test_a_feed_page_is_one_range_of_its_partial_index(tenant_a, where, index):
    with connection.cursor() as cursor:
        cursor.execute(FILL, [tenant_a.pk])
        cursor.execute("ANALYZE inbox_items")
    shown = plan(
        f"SELECT * FROM inbox_items WHERE tenant_id = %s AND subscriber = %s AND {where} "  # noqa: S608
        "ORDER BY created_at DESC, id DESC LIMIT 50",
        [tenant_a.pk, "user-7"],
    )
    assert index in shown, shown
    assert "Sort" not in shown, shown


def test_counts_are_one_row_and_kept_by_every_change(tenant_a):
    from inbox import statements

    with connection.cursor() as cursor:
        cursor.execute(FILL, [tenant_a.pk])
    for n in range(500):
        statements.recount(tenant_a.pk, f"user-{n}")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE inbox_counts")
    shown = plan("SELECT unseen, unread, total FROM inbox_counts WHERE tenant_id = %s AND subscriber = %s",
                 [tenant_a.pk, "user-7"])  # fmt: skip
    assert "inbox_counts_one_per_subscriber" in shown, shown
    kept = statements.counts(tenant_a.pk, "user-7")
    items = list(InboxItem.objects.filter(subscriber="user-7").order_by("created_at")[:6])
    for item, action in zip(items, ("seen", "read", "unread", "archive", "unarchive", "read"), strict=True):
        statements.change(tenant_a.pk, "user-7", item.id, action)
        statements.change(tenant_a.pk, "user-7", item.id, action)  # repeated: no change
    statements.mark_all(tenant_a.pk, "user-7", "seen", None)
    statements.mark_all(tenant_a.pk, "user-7", "archived", "none-such")
    counted = statements.counts(tenant_a.pk, "user-7")
    statements.recount(tenant_a.pk, "user-7")
    assert statements.counts(tenant_a.pk, "user-7") == counted != kept
    assert counted["unseen"] == 0
