"""The e2e bench's set-up: every run starts from vacuumed tables, and from fresh indexes when the
bench has the database to itself."""

from __future__ import annotations

import pytest
from django.db import connection

from benchmarks.runner import vacuum_hot_tables
from notifications.models import Notification
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)  # VACUUM cannot run in a transaction


def index_file(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relfilenode FROM pg_class WHERE relname = %s", [name])
        return cursor.fetchone()[0]


def test_indexes_are_rebuilt_only_for_tables_left_empty(tenant_a):
    factories.queued(tenant_a, factories.provider(tenant_a), 5)
    before, queue_before = index_file("notifications_pkey"), index_file("queue_state_ready_idx")
    vacuum_hot_tables()
    assert index_file("notifications_pkey") == before, "a table holding rows must not be reindexed"
    assert index_file("queue_state_ready_idx") == queue_before

    Notification.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM queue_state")
    vacuum_hot_tables()
    assert index_file("notifications_pkey") != before
    assert index_file("queue_state_ready_idx") != queue_before
