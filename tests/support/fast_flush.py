"""Emptying the test database after a transactional test, in milliseconds instead of a second.

Django's flush (what `django_db(transaction=True)` runs after each test) TRUNCATEs every model
table, whether it holds rows or not. A TRUNCATE gives each table, index and partition a new file
and rewrites its catalog rows: here 56 tables with 186 indexes and 18 partitions took 0.4–1.0 s a
test, growing through the run as the catalog bloats (autovacuum is off on this machine), about a
third of the suite's time.

`flush(connection)` empties only what holds rows, with the same result (every model table empty,
sequences untouched, then Django's post_migrate, as flush emits it):

- one statement finds the non-empty tables and their sizes;
- tables over `TRUNCATE_OVER_BYTES` (a test's hundred thousand rows) are TRUNCATEd, together with
  every table that references them by a foreign key (PostgreSQL requires it);
- the rest are emptied by DELETE with `session_replication_role = replica`, so neither the
  foreign-key triggers nor the audit log's append-only trigger fire (the order of deletes does not
  matter, and the audit table may be emptied, as Django's flush may TRUNCATE it here);
- then VACUUM of the deleted tables, so their dead rows neither bloat the next test's tables nor
  mislead its plans;
- content types and permissions are kept, so of Django's post_migrate only core's is sent: it
  makes the day partitions a test may have dropped (contenttypes' and auth's receivers, 50 ms
  of checks that would write nothing, run for core's models only).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import connections, transaction
from django.db.models.signals import post_migrate

TRUNCATE_OVER_BYTES = 4 * 1024 * 1024
KEPT = frozenset({"django_content_type", "auth_permission"})

_REFERENCES_SQL = """
    SELECT DISTINCT ref.relname, src.relname
    FROM pg_constraint c
    JOIN pg_class ref ON ref.oid = c.confrelid
    JOIN pg_class src ON src.oid = c.conrelid
    WHERE c.contype = 'f' AND ref.relnamespace = current_schema()::regnamespace
"""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def occupied(cursor: Any, tables: list[str]) -> dict[str, int]:  # noqa: ANN401
    """{table: bytes} of the model tables holding at least one row (partitioned tables with their
    partitions), in one statement."""
    probes = [
        f"SELECT %s, (SELECT coalesce(sum(pg_relation_size(relid)), 0) FROM pg_partition_tree(%s::regclass))::bigint"
        f" WHERE EXISTS (SELECT FROM {_quote(t)})"
        for t in tables
    ]
    cursor.execute(" UNION ALL ".join(probes), [v for t in tables for v in (t, _quote(t))])
    return dict(cursor.fetchall())


def plan(sizes: dict[str, int], references: list[tuple[str, str]]) -> tuple[set[str], set[str]]:
    """(to truncate, to delete from) for the occupied tables `sizes`: the big ones and, closed
    over `references` (referenced, referencing), everything that points at them; the rest."""
    truncate = {t for t, size in sizes.items() if size > TRUNCATE_OVER_BYTES}
    grew = True
    while grew:
        more = {src for ref, src in references if ref in truncate and src not in truncate}
        truncate |= more
        grew = bool(more)
    return truncate, set(sizes) - truncate - KEPT


def flush(alias: str, *, send_post_migrate: bool = True) -> None:
    """Empty the model tables of database `alias` (see the module's docstring)."""
    connection = connections[alias]
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        sizes = occupied(cursor, tables)
        cursor.execute(_REFERENCES_SQL)
        known = set(tables)
        references = [(ref, src) for ref, src in cursor.fetchall() if ref in known and src in known]
        truncate, delete = plan(sizes, references)
        with transaction.atomic(using=alias):
            if delete:
                cursor.execute("SET LOCAL session_replication_role = replica")
            for table in sorted(delete):
                cursor.execute(f"DELETE FROM {_quote(table)}")  # noqa: S608 - table names from the catalog
            if truncate:
                cursor.execute(f"TRUNCATE {', '.join(_quote(t) for t in sorted(truncate))}")
        if delete:
            cursor.execute(f"VACUUM {', '.join(_quote(t) for t in sorted(delete))}")
    if send_post_migrate:
        core = apps.get_app_config("core")
        post_migrate.send(sender=core, app_config=core, verbosity=0, interactive=False, using=alias, apps=apps,
                          plan=[])  # fmt: skip


def install() -> None:
    """Make TransactionTestCase (and so pytest-django's `transaction=True`) flush with `flush` on
    PostgreSQL, where Django would TRUNCATE every table; for test cases that restrict
    `available_apps` or use serialized rollback, Django's own flush runs."""
    from django.test import TransactionTestCase

    original = TransactionTestCase._fixture_teardown

    def _fixture_teardown(self: TransactionTestCase) -> None:
        names = self._databases_names(include_mirrors=False)
        if self.available_apps is not None or self.serialized_rollback:
            original(self)
            return
        for name in names:
            flush(name)

    TransactionTestCase._fixture_teardown = _fixture_teardown
