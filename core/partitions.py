"""Day partitions of history tables (PostgreSQL declarative RANGE partitioning).

A partitioned table `T` partitioned by a timestamp column has one partition a UTC day, `T_pYYYYMMDD`
covering [day, day + 1), and a DEFAULT partition `T_default` that takes whatever no day partition
covers (an upkeep that lapsed, a vendor timestamp years off), so an insert never fails.

- `ensure(table)` creates the partitions of today and the next `DAYS_AHEAD` days that are missing.
  The scheduler calls it in its upkeep (`keep_ahead`, at most hourly) and `migrate` after every run
  (core.apps), so the day partitions exist before their rows arrive. A partition is made as a plain
  table with its indexes and then ATTACHed: ATTACH takes SHARE UPDATE EXCLUSIVE on the parent (inserts
  go on); CREATE TABLE … PARTITION OF would take ACCESS EXCLUSIVE. Rows of that day already in the
  default partition move into the new one in the same transaction.
- `partitions(table)` lists them from the catalog (pg_inherits), with their bounds.
- `convert(...)` is what the migrations run: rename the plain table away, create the partitioned one,
  copy the rows, drop the old one.

Which tables are partitioned is read from the catalog (pg_partitioned_table), so this module knows no
table of the apps above it; the apps' migrations name theirs. Partition indexes are named after the
parent's (`attempt_finished_idx_p20261201`), so plans still show which index serves a query.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import connections, transaction

logger = logging.getLogger(__name__)

DAYS_AHEAD = 7  # day partitions kept ready beyond today
MAX_DAYS_BACK = 400  # `convert` makes day partitions this far back at most; older rows go to the default
KEEP_AHEAD_EVERY = 3600.0  # seconds between the scheduler's checks
DEFAULT_SUFFIX = "default"

_DAY_SUFFIX = re.compile(r"^p(\d{8})$")


@dataclass(frozen=True)
class Partition:
    name: str
    lower: datetime | None  # both None: the default partition
    upper: datetime | None

    @property
    def is_default(self) -> bool:
        return self.lower is None and self.upper is None


def day_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_{DEFAULT_SUFFIX}"


def day_start(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def quote(name: str) -> str:
    """A table, index or column name (from code or the catalog), double-quoted for SQL text."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"unexpected identifier {name!r}")
    return f'"{name}"'


# --- the catalog ---------------------------------------------------------------------------------------
def partitioned_tables(*, using: str = "default") -> dict[str, str]:
    """{table: partition key column} of every range-partitioned table on a single column in this schema."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, a.attname
            FROM pg_partitioned_table p
            JOIN pg_class c ON c.oid = p.partrelid
            JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
            WHERE p.partstrat = 'r' AND p.partnatts = 1 AND pg_table_is_visible(c.oid)
            ORDER BY c.relname
            """
        )
        return dict(cursor.fetchall())


def partitions(table: str, *, using: str = "default") -> list[Partition]:
    """The partitions of `table`, day partitions oldest first, the default partition last."""
    with connections[using].cursor() as cursor:
        # The bounds are cast back in SQL, in this session's time zone, as the catalog printed them.
        cursor.execute(
            r"""
            SELECT c.relname, (m)[1]::timestamptz, (m)[2]::timestamptz
            FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid
            CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                            'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)') AS m
            WHERE i.inhparent = %s::regclass AND m IS NOT NULL
            UNION ALL
            SELECT c.relname, NULL, NULL
            FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = %s::regclass AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'
            """,
            [table, table],
        )
        rows = [Partition(name, lower, upper) for name, lower, upper in cursor.fetchall()]
    return sorted(rows, key=lambda p: (p.is_default, p.lower or datetime.min.replace(tzinfo=UTC)))


def _columns(cursor, table: str) -> list[str]:
    cursor.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum",
        [table],
    )
    return [r[0] for r in cursor.fetchall()]


def _index_statements(cursor, table: str, partition: str, suffix: str) -> list[str]:
    """The parent's indexes, as statements that build the same on `partition` (so ATTACH adopts them)."""
    cursor.execute(
        """
        SELECT ic.relname, pg_get_indexdef(x.indexrelid), con.conname, pg_get_constraintdef(con.oid)
        FROM pg_index x
        JOIN pg_class ic ON ic.oid = x.indexrelid
        LEFT JOIN pg_constraint con ON con.conindid = x.indexrelid AND con.conrelid = x.indrelid
        WHERE x.indrelid = %s::regclass
        ORDER BY ic.relname
        """,
        [table],
    )
    statements = []
    for index, indexdef, constraint, constraintdef in cursor.fetchall():
        if constraint is not None:
            statements.append(
                f"ALTER TABLE {quote(partition)} ADD CONSTRAINT {quote(f'{constraint}_{suffix}'[:63])} {constraintdef}"
            )
        else:
            # "CREATE INDEX name ON ONLY public.table USING …": the same definition on the partition
            _, _, using_part = indexdef.partition(" USING ")
            unique = "UNIQUE " if indexdef.startswith("CREATE UNIQUE") else ""
            statements.append(
                f"CREATE {unique}INDEX {quote(f'{index}_{suffix}'[:63])} ON {quote(partition)} USING {using_part}"
            )
    return statements


def name_partition_indexes(cursor, table: str) -> list[str]:  # noqa: ANN001
    """Rename each partition's copy of a `table` index to the parent's name and the partition's
    suffix (`attempt_finished_idx_p20261201`), as `ensure` names those it builds; for a migration that
    adds an index or key to the partitioned table (PostgreSQL names the copies after their partition).
    Returns the new names."""
    cursor.execute(
        """
        SELECT pc.relname, cc.relname, t.relname
        FROM pg_index px
        JOIN pg_class pc ON pc.oid = px.indexrelid
        JOIN pg_inherits i ON i.inhparent = px.indexrelid
        JOIN pg_class cc ON cc.oid = i.inhrelid
        JOIN pg_index cx ON cx.indexrelid = i.inhrelid
        JOIN pg_class t ON t.oid = cx.indrelid
        WHERE px.indrelid = %s::regclass
        ORDER BY 1, 2
        """,
        [table],
    )
    renamed = []
    for parent, child, partition in cursor.fetchall():
        wanted = f"{parent}_{partition.removeprefix(f'{table}_')}"[:63]
        if child != wanted:
            # an index that backs a constraint renames the constraint with it
            cursor.execute(f"ALTER INDEX {quote(child)} RENAME TO {quote(wanted)}")
        renamed.append(wanted)
    return renamed


def unsummarize_if_empty(cursor, relation: str) -> bool:  # noqa: ANN001
    """If `relation` has no row, take back the summary its BRIN indexes' build gave the (empty) first
    block range: while it stands, every insert into that range rewrites it (a WAL record a row); an
    unsummarised range costs an insert nothing until the janitor summarises it, full
    (queueing.janitor.summarize_brin). Returns whether it was empty."""
    cursor.execute(f"SELECT NOT EXISTS (SELECT FROM {quote(relation)})")  # noqa: S608 - a quoted identifier
    if not cursor.fetchone()[0]:
        return False
    cursor.execute(
        "SELECT brin_desummarize_range(x.indexrelid, 0) FROM pg_index x "
        "JOIN pg_class ic ON ic.oid = x.indexrelid JOIN pg_am am ON am.oid = ic.relam "
        "WHERE x.indrelid = %s::regclass AND am.amname = 'brin'",
        [relation],
    )
    return True


# --- making partitions -----------------------------------------------------------------------------------
ENSURE_LOCK_TIMEOUT = "5s"  # ATTACH waits this long at most for the default partition (a prune batch on it)


def _lock(cursor, table: str) -> None:
    """One maker per table at a time (transaction-scoped: nothing outlives it behind a pooler)."""
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [ENSURE_LOCK_TIMEOUT])
    cursor.execute("SELECT pg_advisory_xact_lock(hashtext('omnipost.partitions.' || %s))", [table])


def _attach(cursor, table: str, column: str, name: str, bounds: str, *, move_from_default: str | None) -> None:
    cursor.execute(f"CREATE TABLE {quote(name)} (LIKE {quote(table)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    suffix = name.removeprefix(f"{table}_")
    for statement in _index_statements(cursor, table, name, suffix):
        cursor.execute(statement)
    unsummarize_if_empty(cursor, name)
    if move_from_default is not None:
        # ATTACH checks the default partition holds no row of the new range: move them first. The
        # lock on the default partition (taken by the DELETE) only holds up inserts routed there.
        cols = ", ".join(quote(c) for c in _columns(cursor, table))
        key, source = quote(column), quote(move_from_default)
        sql = f"WITH moved AS (DELETE FROM ONLY {source} WHERE {key} >= %s AND {key} < %s RETURNING {cols}) "  # noqa: S608
        sql += f"INSERT INTO {quote(name)} ({cols}) SELECT {cols} FROM moved"  # noqa: S608
        cursor.execute(sql, list(move_bounds(bounds)))
    cursor.execute(f"ALTER TABLE {quote(table)} ATTACH PARTITION {quote(name)} {bounds}")


def move_bounds(bounds: str) -> tuple[str, str]:
    lower, upper = re.findall(r"'([^']+)'", bounds)
    return lower, upper


def _day_bounds(day: date) -> str:
    return (
        f"FOR VALUES FROM ('{day_start(day).isoformat()}') TO ('{day_start(day + timedelta(days=1)).isoformat()}')"
    )


def ensure(
    table: str, *, today: date | None = None, days_ahead: int = DAYS_AHEAD, start: date | None = None,
    using: str = "default",
) -> list[str]:  # fmt: skip
    """Create the missing day partitions from `start` (default: today) through today + `days_ahead`,
    and the default partition if missing; returns the names created. Safe to run from several
    processes at once (a transaction-scoped advisory lock per table; nothing outlives the transaction)."""
    today = today or datetime.now(UTC).date()
    first = min(start or today, today)
    wanted = [first + timedelta(days=i) for i in range((today - first).days + days_ahead + 1)]
    column = partitioned_tables(using=using).get(table)
    if column is None:
        raise ValueError(f"{table} is not a range-partitioned table")
    created = []
    existing = {p.name for p in partitions(table, using=using)}
    default = default_name(table)
    for day in wanted:
        name = day_name(table, day)
        if name in existing:
            continue
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            _lock(cursor, table)
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
            if cursor.fetchone()[0]:
                continue
            _attach(cursor, table, column, name, _day_bounds(day),
                    move_from_default=default if default in existing else None)  # fmt: skip
        created.append(name)
    if default not in existing:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            _lock(cursor, table)
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [default])
            if not cursor.fetchone()[0]:
                _attach(cursor, table, column, default, "DEFAULT", move_from_default=None)
                created.append(default)
    if created:
        logger.info("created partitions %s", ", ".join(created))
    return created


def ensure_all(*, today: date | None = None, using: str = "default") -> list[str]:
    """`ensure` for every partitioned table in the schema."""
    created = []
    for table in partitioned_tables(using=using):
        created += ensure(table, today=today, using=using)
    return created


class KeepAhead:
    """`ensure_all` at most every `every` seconds (the scheduler's upkeep, between its batches)."""

    def __init__(self, every: float = KEEP_AHEAD_EVERY, clock=time.monotonic) -> None:  # noqa: ANN001
        self.every = every
        self.clock = clock
        self._next = 0.0

    def __call__(self, using: str = "default") -> list[str]:
        if self.clock() < self._next:
            return []
        self._next = self.clock() + self.every
        return ensure_all(using=using)


# --- converting a plain table ----------------------------------------------------------------------------
_LIKE = "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMMENTS"


def _replace_table(
    cursor, table: str, old: str, sequence: str | None, index_suffix: str, partitioning: str,  # noqa: ANN001
    primary_key: Sequence[str], indexes: Sequence[str],
) -> None:  # fmt: skip
    """`table` (its sequence and indexes) renamed to `old`, and a new empty `table` like it
    (`partitioning`: its PARTITION BY clause, or "") with `primary_key` and `indexes`."""
    cursor.execute(f"ALTER TABLE {quote(table)} RENAME TO {quote(old)}")
    if sequence:
        cursor.execute(f"ALTER SEQUENCE {sequence} RENAME TO {quote(old + '_id_seq')}")
    cursor.execute("SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
                   "WHERE x.indrelid = %s::regclass", [old])  # fmt: skip
    for (index,) in cursor.fetchall():
        cursor.execute(f"ALTER INDEX {quote(index)} RENAME TO {quote((index + index_suffix)[:63])}")
    cursor.execute(f"CREATE TABLE {quote(table)} (LIKE {quote(old)} {_LIKE}){partitioning}")
    keys = ", ".join(quote(c) for c in primary_key)
    cursor.execute(f"ALTER TABLE {quote(table)} ADD CONSTRAINT {quote(table + '_pkey')} PRIMARY KEY ({keys})")
    for statement in indexes:
        cursor.execute(statement)


def convert(
    schema_editor, table: str, column: str, *, primary_key: Sequence[str], indexes: Sequence[str],
    days_ahead: int = DAYS_AHEAD,
) -> None:  # fmt: skip
    """Replace the plain `table` by one partitioned by day of `column`, rows included.

    `primary_key` must include `column`; `indexes` are the statements that build the partitioned
    table's other indexes (they replace the plain table's, whose names are freed first). Runs in the
    migration's transaction: the table is locked for the copy."""
    old = f"{table}_unpartitioned"
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {quote(table)} IN ACCESS EXCLUSIVE MODE")
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
        (sequence,) = cursor.fetchone()
        _replace_table(cursor, table, old, sequence, "_unpartitioned", f" PARTITION BY RANGE ({quote(column)})",
                       primary_key, indexes)  # fmt: skip
        cursor.execute(f"SELECT min({quote(column)}), max(id) FROM {quote(old)}")  # noqa: S608 - quoted identifiers
        oldest, last_id = cursor.fetchone()
    today = datetime.now(UTC).date()
    start = max(oldest.astimezone(UTC).date(), today - timedelta(days=MAX_DAYS_BACK)) if oldest else today
    ensure(table, today=today, start=start, days_ahead=days_ahead, using=schema_editor.connection.alias)
    with schema_editor.connection.cursor() as cursor:
        cols = ", ".join(quote(c) for c in _columns(cursor, old))
        cursor.execute(f"INSERT INTO {quote(table)} ({cols}) OVERRIDING SYSTEM VALUE SELECT {cols} FROM {quote(old)}")  # noqa: S608
        if last_id is not None:
            cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, last_id])
        cursor.execute(f"DROP TABLE {quote(old)}")
        cursor.execute(f"ANALYZE {quote(table)}")


def unconvert(schema_editor, table: str, *, primary_key: Sequence[str], indexes: Sequence[str]) -> None:
    """The reverse of `convert`: one plain table again, rows included."""
    old = f"{table}_partitioned"
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {quote(table)} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(f"SELECT pg_get_serial_sequence(%s, 'id'), (SELECT max(id) FROM {quote(table)})", [table])  # noqa: S608
        sequence, last_id = cursor.fetchone()
        _replace_table(cursor, table, old, sequence, "_partitioned", "", primary_key, indexes)
        cols = ", ".join(quote(c) for c in _columns(cursor, old))
        cursor.execute(f"INSERT INTO {quote(table)} ({cols}) OVERRIDING SYSTEM VALUE SELECT {cols} FROM {quote(old)}")  # noqa: S608
        if last_id is not None:
            cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, last_id])
        cursor.execute(f"DROP TABLE {quote(old)}")
