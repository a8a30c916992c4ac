"""One owner per table: the raw SQL that writes a table (INSERT, UPDATE, DELETE, upsert, TRUNCATE) is
spelled in one module, of the app that owns the table; every other module composes that module's
fragments or calls its functions. The dispatcher's record statement, prune's batch and the
receipts statement are chains of writable CTEs over several apps' tables: each CTE's text comes
from its table's owner, and they only join them.

Read from the source tree (tests.support.sql_scan), so a write spelled anywhere else fails here, a
table added without an owner fails here, and no folder is allowed as a whole. ORM writes through a
model are not raw SQL and are not checked here (queue items' are: tests/queueing/test_one_place.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from tests.support.sql_scan import DYNAMIC, production_sources, tables_by_package, writes, written_tables

ROOT = Path(settings.BASE_DIR)

# table -> the one module that may spell SQL writing it. A table written only through its model
# names the module its statements would go to (its app's statements, or the model's module).
OWNERS: dict[str, str] = {
    # core: tenancy, API keys, the audit log (all through their models)
    "tenants": "core/models/tenancy.py",
    "tenant_memberships": "core/models/tenancy.py",
    "api_keys": "core/models/api_keys.py",
    "audit_events": "core/models/audit.py",
    # queueing: the generic queue, its lanes' limits, buckets, scheduled jobs and workers
    "queue_state": "queueing/queue.py",
    "lane_limits": "queueing/queue.py",
    "rate_limit_buckets": "queueing/ratelimit.py",
    "scheduled_jobs": "queueing/schedule.py",
    "workers": "queueing/models.py",
    # the rooms under notifications
    "providers": "providers/models.py",
    "subscribers": "recipients/services.py",
    "suppressions": "recipients/suppressions.py",
    "categories": "recipients/models.py",
    "unsubscribe_token_revocations": "recipients/models.py",
    "devices": "recipients/devices.py",
    "topics": "recipients/topics.py",  # membership counters, a fan-out's begin and end
    "topic_subscribers": "recipients/topics.py",  # registration's upsert, the record statement's deactivation
    "provider_circuits": "routing/circuits.py",
    "templates": "templating/models.py",
    "template_versions": "templating/services.py",  # written once per change, through its model
    # notifications: the notification rows and what hangs off them; the /metrics counters
    "notifications": "notifications/statements.py",
    "delivery_attempts": "notifications/statements.py",
    "idempotency_records": "notifications/statements.py",
    "tenant_queues": "notifications/statements.py",
    "provider_messages": "notifications/statements.py",  # (provider, message id) → notification
    "notification_devices": "notifications/statements.py",  # a push's devices and how each went
    "delivery_counters": "notifications/counters.py",
    # dead letters
    "dead_letter_queue": "dlq/statements.py",
    # outbound events: the events, their outbox of outcome batches, deliveries, attempts, endpoints
    "events": "events/statements.py",
    "event_outcome_batches": "events/statements.py",
    "event_deliveries": "events/statements.py",
    "event_attempts": "events/statements.py",
    "event_endpoints": "events/statements.py",
    # the in-app feed: the record statement's feed items, the subscriber's state changes
    "inbox_items": "inbox/statements.py",
    "inbox_token_revocations": "inbox/statements.py",
    "inbox_settings": "inbox/statements.py",
    "inbox_counts": "inbox/statements.py",
    # workflows: definitions and runs (their models), throttle and digest windows (conditional statements)
    "workflows": "workflows/models.py",
    "workflow_runs": "workflows/statements.py",
    "workflow_throttles": "workflows/statements.py",
    "workflow_digests": "workflows/statements.py",
    # bulk sends: the jobs and their stored rows (through their models)
    "bulk_sends": "bulk/services.py",
    "bulk_send_chunks": "bulk/services.py",
    "workflow_fanouts": "workflows/statements.py",  # a chunk moves its fan-out's cursor
    "workflow_fanout_cancels": "workflows/statements.py",  # a cancel's named members ahead of its fan-out
    # inbound receipts
    "notification_events": "receipts/services.py",
    "receipt_counters": "receipts/services.py",
    "receipt_dedup": "receipts/services.py",
}
# Apps whose tables no production module writes in raw SQL (Django's own): no owner at all.
NOT_OURS = ("django",)
# Generic helpers that write a table their caller names (the text holds `{table}`, not a name):
# module -> why. Nothing else may write a table the text does not spell.
DYNAMIC_WRITERS: dict[str, str] = {
    "core/partitions.py": "moves rows between a partitioned table and its partitions, for the table a migration "
    "or the keep-ahead names",
    "core/retention.py": "deletes rows past retention, in page ranges, from a table its owner registered or a "
    "history partition prune found in the catalog",
}


def our_tables() -> dict[str, str]:
    """table -> the package whose model (or migration's raw SQL) makes it, for our apps."""
    return {
        table: package
        for package, tables in tables_by_package().items()
        if package not in NOT_OURS
        for table in tables
    }


def violations(
    sources: dict[str, str], owners: dict[str, str] = OWNERS, dynamic: dict[str, str] = DYNAMIC_WRITERS
) -> dict[str, list[str]]:
    """path -> "line N: table" of each raw SQL write that `owners` does not give to that path."""
    found: dict[str, list[str]] = {}
    for path, source in sources.items():
        for line, table in writes(source):
            allowed = path in dynamic if table == DYNAMIC else owners.get(table) == path
            if not allowed:
                found.setdefault(path, []).append(f"line {line}: {table}")
    return found


def unowned(tables: dict[str, str], owners: dict[str, str]) -> dict[str, str]:
    """table -> why, for each table without an owner in its own app."""
    wrong = {}
    for table, package in tables.items():
        owner = owners.get(table)
        if owner is None:
            wrong[table] = f"no owner (its app: {package})"
        elif owner.split("/")[0] != package:
            wrong[table] = f"owned by {owner}, outside its app {package}"
    return wrong


# --- the reader sees what it is meant to ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tables"),
    [
        ("UPDATE notifications n SET status = %s", ["notifications"]),
        ("update queue_state set ready = true", ["queue_state"]),
        ('INSERT INTO "dead_letter_queue" (id) VALUES (%s)', ["dead_letter_queue"]),
        ("INSERT INTO delivery_counters AS dc (shard) SELECT 1 ON CONFLICT (shard) DO UPDATE SET count = 1",
         ["delivery_counters"]),  # fmt: skip
        ("WITH gone AS (\n    DELETE FROM ONLY public.events WHERE id = 1 RETURNING 1) SELECT 1", ["events"]),
        ("TRUNCATE TABLE queue_state, workers", ["queue_state", "workers"]),
        ("MERGE INTO suppressions s USING x ON true", ["suppressions"]),
        ("DELETE FROM {table} WHERE ctid < %s", [DYNAMIC]),
        ("UPDATE ", [DYNAMIC]),  # "UPDATE " + name
        # reads and locks are not writes
        ("SELECT 1 FROM notifications n WHERE n.id = %s FOR UPDATE OF n SKIP LOCKED", []),
        ("SELECT 1 FROM queue_state FOR NO KEY UPDATE", []),
        ("SELECT 1 FROM queue_state FOR\n        UPDATE SKIP LOCKED", []),
        ("-- then UPDATE notifications, in the next statement\nSELECT 1", []),
        ("VACUUM (ANALYZE, TRUNCATE false) {}", []),
        ("update", []),  # a word (a viewset action), not a statement
    ],
)
def test_the_reader_finds_the_tables_a_text_writes(text, tables):
    assert written_tables(text) == tables


def test_docstrings_are_prose_and_f_strings_keep_their_holes():
    source = (
        '"""Moves notifications along: UPDATE notifications is the domain\'s."""\n'
        'def f(name):\n'
        '    """DELETE FROM queue_state, said in prose."""\n'
        '    return f"DELETE FROM ONLY {name} WHERE x" + "INSERT INTO notifications (id) SELECT 1"\n'
    )
    assert writes(source) == [(4, DYNAMIC), (4, "notifications")]


@pytest.mark.parametrize(
    ("path", "snippet", "expected"),
    [
        # the dispatcher spells a domain table's write itself instead of composing its owner's fragment
        ("dispatch/delivery.py", 'X = """changed AS (\n    UPDATE notifications n SET status = k.status"""\n',
         "line 1: notifications"),  # fmt: skip
        ("dispatch/delivery.py", 'C = f"INSERT INTO delivery_counters AS dc (shard) SELECT {s}"\n',
         "line 1: delivery_counters"),  # fmt: skip
        # another module of the owner's own app is not the owner either
        ("notifications/services.py", 'Q = "INSERT INTO notifications (id) SELECT %s"\n', "line 1: notifications"),
        # a lower app writes a higher one's table
        ("queueing/scheduler.py", 'S = "UPDATE notifications SET status = \'queued\'"\n', "line 1: notifications"),
        # a table only the running code knows, outside the generic helpers
        ("operations/retention.py", 'def f(t):\n    return f"DELETE FROM ONLY {t} WHERE ctid < %s"\n',
         f"line 2: {DYNAMIC}"),  # fmt: skip
        # Django's own tables have no owner among our modules
        ("core/services.py", 'S = "UPDATE auth_user SET is_active = false"\n', "line 1: auth_user"),
    ],
)
def test_a_deliberate_violation_is_found(path, snippet, expected):
    found = violations({path: snippet}, {**OWNERS, "auth_user": None})
    assert found == {path: [expected]}


def test_the_owner_may_write_its_table():
    assert violations({"notifications/statements.py": 'Q = "UPDATE notifications SET x = 1"\n'}) == {}
    assert violations({"core/retention.py": 'D = "DELETE FROM ONLY {table} WHERE {condition}"\n'}) == {}


def test_a_table_without_an_owner_in_its_app_is_found():
    tables = {"queue_state": "queueing", "push_tokens": "push", "dead_letter_queue": "dlq"}
    owners = {"queue_state": "queueing/queue.py", "dead_letter_queue": "dispatch/delivery.py"}
    assert unowned(tables, owners) == {
        "push_tokens": "no owner (its app: push)",
        "dead_letter_queue": "owned by dispatch/delivery.py, outside its app dlq",
    }


# --- the rules, on the tree ----------------------------------------------------------------------------


def test_every_table_has_one_owner_in_its_own_app():
    tables = our_tables()
    assert len(tables) >= 30
    assert unowned(tables, OWNERS) == {}
    assert set(OWNERS) == set(tables), "an owner for a table that no longer exists"
    missing = {module for module in {*OWNERS.values(), *DYNAMIC_WRITERS} if not (ROOT / module).is_file()}
    assert missing == set()


def test_the_scan_covers_the_production_tree():
    sources = production_sources(ROOT)
    assert {"dispatch/delivery.py", "operations/retention.py", "queueing/queue.py", "receipts/services.py"} <= set(
        sources
    )
    assert not any(p.startswith(("tests/", "bench/", "benchmarks/")) or "/migrations/" in p for p in sources)
    # the owners' own writes are seen (the scan is not blind to them)
    assert {t for _, t in writes(sources["queueing/queue.py"])} == {"queue_state", "lane_limits"}


def test_only_a_tables_owner_writes_it():
    assert violations(production_sources(ROOT)) == {}
