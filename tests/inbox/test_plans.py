"""A feed page and the counts read only the subscriber's rows: the partial indexes led by (tenant,
subscriber) in the feed's order, whatever else the table holds."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

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


def test_counts_read_the_subscribers_rows_only(tenant_a):
    with connection.cursor() as cursor:
        cursor.execute(FILL, [tenant_a.pk])
        cursor.execute("ANALYZE inbox_items")
    from inbox.api.views import _COUNTS_SQL

    shown = plan(_COUNTS_SQL, [tenant_a.pk, "user-7"])
    assert "Seq Scan" not in shown, shown
    assert "inbox_feed_idx" in shown, shown
    assert uuid.UUID(str(tenant_a.pk))
