"""One statement, one place, for the queue: every ORM write of a queue item is in `queueing/queue.py`
(its raw SQL writes, like every table's, are held to their owner by tests/test_table_owners.py), and
whether an item is rate-limited is decided only by `queueing.ratelimit` (`is_limited` /
`limited_sql`). Read from the source tree, so a new write elsewhere fails here; the cancel-side
functions it asks for (`lock_for`, `remove_for`) are checked for what they do and for their
statement counts."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction

from notifications.models import Notification
from queueing import queue
from queueing.models import QueueItem
from tests import factories
from tests.support import sql_scan

REPO = Path(settings.BASE_DIR)
QUEUE_MODULE = "queueing/queue.py"
# The one module that asks is_limited: the dispatcher's lanes, of the limits they load.
DECIDES_LIMITS = "dispatch/providers.py"
ORM_WRITES = {"update", "delete", "create", "bulk_create", "bulk_update", "get_or_create", "update_or_create",
              "_raw_delete", "save"}  # fmt: skip
LIMIT_RULE_SQL = re.compile(r"rate_per_second\s+IS\s+(?:NOT\s+)?NULL", re.IGNORECASE)


def production_sources() -> dict[str, str]:
    return sql_scan.production_sources(REPO)


def _mentions_queue_item(node: ast.AST) -> bool:
    """Whether a call's receiver chain starts at `QueueItem` (`QueueItem.objects.filter(…).delete()`)."""
    while True:
        if isinstance(node, ast.Name):
            return node.id == "QueueItem"
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return False


def orm_writes(source: str) -> list[int]:
    """Lines of ORM writes of queue items: a write method called on a chain from `QueueItem`, or a
    `QueueItem(…)` built by hand (to be saved)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ORM_WRITES and _mentions_queue_item(func.value):
            lines.append(node.lineno)
        elif isinstance(func, ast.Name) and func.id == "QueueItem":
            lines.append(node.lineno)
    return lines


def calls_of(source: str, name: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called == name:
                lines.append(node.lineno)
    return lines


# --- the scanners see what they are meant to ----------------------------------------------------------


def test_the_scanners_catch_a_deliberate_write_elsewhere():
    chained = "QueueItem.objects.for_tenant(t).filter(\n    notification_id__in=ids\n).delete()\n"
    assert orm_writes(chained) == [1]
    assert orm_writes("QueueItem.objects.filter(pk=1).update(ready=True)") == [1]
    assert orm_writes("QueueItem.objects.bulk_create(items)") == [1]
    assert orm_writes("QueueItem(notification_id=n).save()") == [1, 1]
    assert orm_writes("QueueItem.objects.filter(ready=True).exists()") == []
    assert orm_writes("Notification.objects.filter(pk=1).delete()") == []


def test_the_scan_covers_the_production_tree():
    sources = production_sources()
    assert QUEUE_MODULE in sources and "notifications/services.py" in sources and DECIDES_LIMITS in sources
    assert not any(p.startswith("tests/") for p in sources)
    # The queue module itself writes queue items through the ORM (queue.remove_for).
    assert orm_writes(sources[QUEUE_MODULE])


# --- the rules --------------------------------------------------------------------------------------


def test_queue_item_orm_writes_are_only_in_the_queue_module():
    elsewhere = {
        path: lines
        for path, source in production_sources().items()
        if (lines := orm_writes(source)) and path != QUEUE_MODULE
    }
    assert elsewhere == {}, "change queue items through queueing/queue.py (e.g. queue.remove_for)"


def test_only_the_rate_limit_module_decides_whether_an_item_is_rate_limited():
    sources = production_sources()
    rule_in_sql = {p for p, s in sources.items() if LIMIT_RULE_SQL.search(s)}
    assert rule_in_sql == {"queueing/ratelimit.py"}, "use ratelimit.limited_sql, not the rule spelled out"
    # Items get and change their flag only in the queue module's statements, which use limited_sql.
    composing = {p for p, s in sources.items() if calls_of(s, "limited_sql")}
    assert composing == {QUEUE_MODULE}
    # The dispatcher's lanes ask is_limited of the limits they load, and nothing else does.
    deciding = {p for p, s in sources.items() if calls_of(s, "is_limited")}
    assert deciding == {DECIDES_LIMITS}


# --- the functions cancels use --------------------------------------------------------------------------


@pytest.mark.django_db
def test_lock_for_says_which_items_are_leased_in_one_statement(tenant_a, django_assert_num_queries):
    hook = factories.provider(tenant_a)
    held, idle = factories.queued(tenant_a, hook, 2)
    [lease] = queue.claim(1)  # the oldest
    assert lease.notification_id == held.id
    with transaction.atomic(), django_assert_num_queries(1):
        leased = queue.lock_for([idle.id, held.id], tenant_id=tenant_a.pk)
    assert leased == {str(idle.id): False, str(held.id): True}


@pytest.mark.django_db
def test_remove_for_is_one_statement_scoped_to_the_tenant(tenant_a, tenant_b, django_assert_num_queries):
    mine = factories.queued(tenant_a, factories.provider(tenant_a), 3)
    theirs = factories.queued(tenant_b, factories.provider(tenant_b), 1)
    with django_assert_num_queries(1):
        assert queue.remove_for([mine[0].id, theirs[0].id], tenant_id=tenant_a.pk) == 1
    subquery = Notification.objects.for_tenant(tenant_a).filter(pk__in=[n.id for n in mine[1:]]).values("id")
    with django_assert_num_queries(1):
        assert queue.remove_for(subquery, tenant_id=tenant_a.pk) == 2
    assert list(QueueItem.objects.values_list("notification_id", flat=True)) == [theirs[0].id]
