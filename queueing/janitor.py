"""Keeps the queue's churning tables lean: VACUUM them as soon as dead rows pile up.

A queue deletes every row it serves and rewrites rows on every claim, so its indexes fill with
entries for dead rows that each claim has to step over until VACUUM removes them. Autovacuum looks
at a table at most once a minute (and some servers, this project's CI machine among them, run with
it off), while a busy queue leaves tens of thousands of dead rows a second: measured here, a claim
of one item took 87 ms with 800,000 dead rows behind it and 0.35 ms after a VACUUM.

`vacuum_if_needed` reads the statistics collector's dead-row counts and vacuums the tables past
their threshold. It runs where its name says, as maintenance on a process's own connection: the
dispatcher's DB thread every couple of seconds (dispatch.upkeep.maintain), the scheduler between
batches. Only one process vacuums at a time: a session advisory lock is taken with
`pg_try_advisory_lock`, so a second process skips instead of queueing behind the first. Behind
a transaction pooler a session lock would stay on whichever server connection took it
(core.pooling), so there `VACUUM (SKIP_LOCKED)` alone does the skipping, table by table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from psycopg import sql

from core import pooling

logger = logging.getLogger("omnipost.janitor")

# Tables whose rows are rewritten or deleted at the queue's pace (notifications and attempts are
# updated HOT or only inserted, so page pruning keeps up with them). event_deliveries: every event
# delivery is claimed and then recorded out of event_delivery_due_idx; unvacuumed (autovacuum off), the
# event lane's claim stepped over every delivery ever made, 17 ms a claim after 40,000.
CHURNING_TABLES = ("queue_state", "scheduled_jobs", "rate_limit_buckets", "workers", "event_deliveries")
LOCK_KEY = 0x6F6D6E6970_7661  # "omnip" "va": one key for every OmniPost janitor


@dataclass
class Janitor:
    """Decides when to vacuum. `min_dead` dead rows, plus `live_fraction` of the live ones, make a
    table due; `every` seconds is the least time between two looks at the statistics."""

    min_dead: int = 20_000
    live_fraction: float = 0.2
    every: float = 2.0
    clock: Callable[[], float] = time.monotonic
    tables: tuple[str, ...] = CHURNING_TABLES
    _last: float = field(default=float("-inf"), init=False)

    def due(self, stats: list[tuple[str, int, int]]) -> list[str]:
        """The tables among `(name, dead, live)` rows that should be vacuumed now."""
        return [name for name, dead, live in stats if dead >= self.min_dead + self.live_fraction * live]

    def maybe_vacuum(self, conn) -> list[str]:  # noqa: ANN001 - an autocommit psycopg connection
        """Vacuum the due tables if `every` seconds have passed and no other process holds the lock.
        Returns the tables vacuumed."""
        now = self.clock()
        if now - self._last < self.every:
            return []
        self._last = now
        return vacuum_if_needed(conn, self)


def vacuum_if_needed(conn, janitor: Janitor) -> list[str]:  # noqa: ANN001
    stats = conn.execute(
        "SELECT relname, n_dead_tup, n_live_tup FROM pg_stat_user_tables "
        "WHERE relname = ANY(%s) AND schemaname = current_schema()",
        [list(janitor.tables)],
    ).fetchall()
    due = janitor.due(stats)
    if not due:
        return []
    if pooling.pooled():
        return _vacuum(conn, due, "VACUUM (ANALYZE, TRUNCATE false, SKIP_LOCKED) {}")
    (locked,) = conn.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY]).fetchone()
    if not locked:
        return []
    try:
        return _vacuum(conn, due, "VACUUM (ANALYZE, TRUNCATE false) {}")
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])


def _vacuum(conn, tables: list[str], statement: str) -> list[str]:  # noqa: ANN001
    done = []
    for table in tables:
        started = time.perf_counter()
        conn.execute(sql.SQL(statement).format(sql.Identifier(table)))
        done.append(table)
        logger.info("vacuumed %s in %.0f ms", table, (time.perf_counter() - started) * 1000)
    return done


def vacuum_on_default(janitor: Janitor, using: str = "default") -> list[str]:
    """`janitor.maybe_vacuum` on Django's connection (autocommit, outside any transaction: VACUUM
    cannot run inside one), for a process whose SQL all runs on one thread. Off PostgreSQL: nothing."""
    from django.db import connections

    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return []
    connection.ensure_connection()
    return janitor.maybe_vacuum(connection.connection)
