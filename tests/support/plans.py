"""The plan PostgreSQL keeps for a statement the dispatcher prepares: its generic plan, executed.

The dispatcher plans each hot statement once per connection (`plan_cache_mode =
force_generic_plan`, dispatch.delivery.prepare_when_asked). `explain_generic` prepares a
statement the same way and runs `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE` of it, in a
transaction that is rolled back; `nodes` walks the plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg._queries import PostgresQuery  # psycopg's own %(name)s → $n conversion, as execute() does
from psycopg.adapt import Transformer


@dataclass
class Explained:
    plan: dict[str, Any]  # EXPLAIN's top object: "Plan", "Planning", "JIT" when compiled, …
    generic_plans: int  # pg_prepared_statements' count: 1 when the plan run was the generic one
    seen: Any = None  # what `inside` returned, before the rollback


def explain_generic(
    raw: psycopg.Connection, sql: str, params: Mapping[str, Any],
    inside: Callable[[psycopg.Cursor], Any] | None = None, *, own_transaction: bool = True,
) -> Explained:  # fmt: skip
    """`sql` (psycopg %(name)s / %(name)b placeholders) prepared, its generic plan executed and
    explained; `inside(cursor)` runs after it, in the same transaction (to look at what it did).
    `own_transaction=False`: in the caller's open transaction (a test's), which keeps what it did."""
    query = PostgresQuery(Transformer(raw))
    query.convert(sql, params)
    names = list(dict.fromkeys(re.findall(r"(?<!%)%\((\w+)\)[sb]", sql)))  # $1, $2, … in order of first use
    if not own_transaction:
        raw.execute(f"PREPARE omnipost_explained AS {query.query.decode()}")
        raw.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        try:
            cursor = psycopg.ClientCursor(raw)
            cursor.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE omnipost_explained({', '.join(['%s'] * len(names))})",
                [params[name] for name in names],
            )
            raw_plan = cursor.fetchone()[0]
            cursor.execute("SELECT generic_plans FROM pg_prepared_statements WHERE name = 'omnipost_explained'")
            generic = cursor.fetchone()[0]
            seen = inside(cursor) if inside is not None else None
        finally:
            raw.execute("DEALLOCATE omnipost_explained")
            raw.execute("SET LOCAL plan_cache_mode = auto")
        return Explained((json.loads(raw_plan) if isinstance(raw_plan, str) else raw_plan)[0], generic, seen)
    raw.execute("BEGIN")
    try:
        raw.execute(f"PREPARE omnipost_explained AS {query.query.decode()}")
        raw.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor = psycopg.ClientCursor(raw)
        cursor.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE omnipost_explained({', '.join(['%s'] * len(names))})",
            [params[name] for name in names],
        )
        raw_plan = cursor.fetchone()[0]
        cursor.execute("SELECT generic_plans FROM pg_prepared_statements WHERE name = 'omnipost_explained'")
        generic = cursor.fetchone()[0]
        seen = inside(cursor) if inside is not None else None
    finally:
        raw.execute("ROLLBACK")  # psycopg deallocates its own prepared statements after a rollback, and
        # PREPARE is not undone by one: this one goes unless psycopg's DEALLOCATE ALL took it already
        if raw.execute("SELECT 1 FROM pg_prepared_statements WHERE name = 'omnipost_explained'").fetchone():
            raw.execute("DEALLOCATE omnipost_explained")
    return Explained((json.loads(raw_plan) if isinstance(raw_plan, str) else raw_plan)[0], generic, seen)


def nodes(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """`node` and every node under it."""
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def scans(node: Mapping[str, Any]) -> set[tuple[str, str | None]]:
    """(node type, relation) of every node under `node`."""
    return {(n["Node Type"], n.get("Relation Name")) for n in nodes(node)}
