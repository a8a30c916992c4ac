"""One statement, one place: every write of `queue_state` is in `queueing/queue.py` (as a function or
as a fragment other statements compose), and whether an item is rate-limited is decided only by
`queueing.ratelimit` (`is_limited` / `limited_sql`). Read from the source tree, so a new write
elsewhere fails here; the cancel-side functions it asks for (`lock_for`, `remove_for`) are checked
for what they do and for their statement counts."""

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

REPO = Path(settings.BASE_DIR)
QUEUE_MODULE = "queueing/queue.py"
# The dispatcher's record statement acks and releases inside one statement of writable CTEs. It is
# moving (with the claim) to the `dispatch/` app, which composes it from queue.py's fragments; until
# that lands both places are allowed. Remove notifications/delivery.py from here once it has moved.
COMPOSES_QUEUE_FRAGMENTS = ("notifications/delivery.py", "dispatch/")
# Not production code: tests, migrations, and the benchmarks (they load millions of rows directly).
NOT_SCANNED = ("tests/", "bench/", "benchmarks/", "queueing/bench/", ".venv/", "var/", "node_modules/")

SQL_WRITE = re.compile(
    r"\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+queue_state\b", re.IGNORECASE
)
ORM_WRITES = {"update", "delete", "create", "bulk_create", "bulk_update", "get_or_create", "update_or_create",
              "_raw_delete", "save"}  # fmt: skip
LIMIT_RULE_SQL = re.compile(r"rate_per_second\s+IS\s+(?:NOT\s+)?NULL", re.IGNORECASE)


def production_sources() -> dict[str, str]:
    sources = {}
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(NOT_SCANNED) or "/migrations/" in rel:
            continue
        sources[rel] = path.read_text()
    return sources


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


def sql_writes(source: str) -> list[str]:
    return [m.group(0) for m in SQL_WRITE.finditer(source)]


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


def _allowed(path: str, *allowed: str) -> bool:
    return any(path == a or (a.endswith("/") and path.startswith(a)) for a in allowed)


# --- the scanners see what they are meant to ----------------------------------------------------------


def test_the_scanners_catch_a_deliberate_write_elsewhere():
    assert sql_writes("cursor.execute('update queue_state set ready = true')") == ["update queue_state"]
    assert sql_writes('"""\nDELETE FROM queue_state q USING x"""') == ["DELETE FROM queue_state"]
    assert sql_writes("INSERT OR IGNORE INTO queue_state (a) VALUES (1)") == ["INSERT OR IGNORE INTO queue_state"]
    assert sql_writes("SELECT 1 FROM queue_state WHERE ready; UPDATE notifications SET x = 1") == []
    chained = "QueueItem.objects.for_tenant(t).filter(\n    notification_id__in=ids\n).delete()\n"
    assert orm_writes(chained) == [1]
    assert orm_writes("QueueItem.objects.filter(pk=1).update(ready=True)") == [1]
    assert orm_writes("QueueItem.objects.bulk_create(items)") == [1]
    assert orm_writes("QueueItem(notification_id=n).save()") == [1, 1]
    assert orm_writes("QueueItem.objects.filter(ready=True).exists()") == []
    assert orm_writes("Notification.objects.filter(pk=1).delete()") == []


def test_the_scan_covers_the_production_tree():
    sources = production_sources()
    assert QUEUE_MODULE in sources and "notifications/services.py" in sources and "queueing/scheduler.py" in sources
    assert not any(p.startswith("tests/") for p in sources)
    # The queue module itself holds every kind of write.
    found = {w.split()[0].upper() for w in sql_writes(sources[QUEUE_MODULE])}
    assert found == {"INSERT", "UPDATE", "DELETE"}


# --- the rules --------------------------------------------------------------------------------------


def test_queue_state_sql_writes_are_only_in_the_queue_module():
    elsewhere = {
        path: writes
        for path, source in production_sources().items()
        if (writes := sql_writes(source)) and not _allowed(path, QUEUE_MODULE, *COMPOSES_QUEUE_FRAGMENTS)
    }
    assert elsewhere == {}, "write queue_state through queueing/queue.py (a function or a fragment to compose)"


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
    # The dispatcher's lanes ask is_limited of the limits they load (moving to dispatch/).
    deciding = {p for p, s in sources.items() if calls_of(s, "is_limited")}
    assert all(_allowed(p, "queueing/worker.py", "dispatch/") for p in deciding), deciding


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
