"""Keeps the queue's churning tables lean: VACUUM them as soon as dead rows pile up.

A queue deletes every row it serves and rewrites rows on every claim, so its indexes fill with
entries for dead rows that each claim has to step over until VACUUM removes them. Autovacuum looks
at a table at most once a minute (and some servers, this project's CI machine among them, run with
it off), while a busy queue leaves tens of thousands of dead rows a second: measured here, a claim
of one item took 87 ms with 800,000 dead rows behind it and 0.35 ms after a VACUUM.

`vacuum_if_needed` reads the statistics collector's dead-row counts and vacuums the tables past
their threshold, and summarises the full block ranges of the BRIN indexes of the tables whose rows
changed (`summarize_brin`), which VACUUM would do where autovacuum runs. It also ANALYZEs any table
of the schema whose statistics are stale: more rows changed since they were taken than they counted,
plus 1,000 (once per doubling of a growing table; autovacuum, where it runs, analyzes sooner); for a
churning table, whose rows all change at the queue's pace, its size moved that far (a queue of a
steady depth keeps its statistics: analyzed every 2 s, every statement reading it was planned again).
PostgreSQL re-plans a prepared statement once the statistics of a table it reads change, and the
dispatchers keep one generic plan per statement (dispatch.delivery): without fresh statistics, on a
server with autovacuum off, a statement prepared while a table was empty kept the plan made for an
empty table. Measured here: the event lane's claim, planned on an empty `event_deliveries`, read the
whole table per claim (130–360 ms a claim, 323 events/s; with fresh statistics 6 ms a claim).

It runs where its name says, as maintenance on a process's own connection: the dispatcher's
DB thread every couple of seconds (dispatch.upkeep.maintain), the scheduler between batches.
Only one process vacuums or analyzes at a time: a session advisory lock is taken with
`pg_try_advisory_lock`, so a second process skips instead of queueing behind the first. Behind
a transaction pooler a session lock would stay on whichever server connection took it
(core.pooling), so there `SKIP_LOCKED` alone does the skipping, table by table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from core import pooling

logger = logging.getLogger("omnipost.janitor")

# Tables whose rows are rewritten or deleted at the queue's pace (notifications and attempts are
# updated HOT or only inserted, so page pruning keeps up with them). Other apps add theirs with
# `register` (events: its deliveries, claimed and recorded at the same pace), from their AppConfig.ready.
_CHURNING: list[str] = ["queue_state", "scheduled_jobs", "rate_limit_buckets", "workers"]
# Tables that only a part of a process that holds back under load reads (events: the event lane): a
# VACUUM or ANALYZE of these on the dispatcher's DB thread would only hold up the queue's claims and
# records while the process has a backlog (an ANALYZE re-plans the statements that read the table,
# too), so they wait until the backlog is gone (`Janitor.busy`).
_DEFERRED: list[str] = []


def register(churning: Sequence[str] = (), *, deferred: Sequence[str] = ()) -> None:
    """Add an app's tables: `churning`, vacuumed as soon as dead rows pile up; `deferred`, left alone
    while the process is busy (they may be churning too)."""
    _CHURNING.extend(t for t in churning if t not in _CHURNING)
    _DEFERRED.extend(t for t in deferred if t not in _DEFERRED)


def churning_tables() -> tuple[str, ...]:
    return tuple(_CHURNING)


def deferred_tables() -> tuple[str, ...]:
    return tuple(_DEFERRED)


TENDED_SECONDS = 60  # a table autovacuum vacuumed within this long is being looked after (busy_factor)
LOCK_KEY = 0x6F6D6E6970_7661  # "omnip" "va": one key for every OmniPost janitor


@dataclass
class Janitor:
    """Decides when to vacuum. `min_dead` dead rows, plus `live_fraction` of the live ones, make a
    table due; `every` seconds is the least time between two looks at the statistics."""

    min_dead: int = 20_000
    live_fraction: float = 0.2
    analyze_min: int = 1000  # rows changed since the statistics were taken, beyond
    analyze_fraction: float = 1.0  # this fraction of the rows they counted: analyzed as a table doubles
    every: float = 2.0
    clock: Callable[[], float] = time.monotonic
    tables: tuple[str, ...] = field(default_factory=churning_tables)
    busy: Callable[[], bool] = lambda: False  # the process has a backlog: `deferred` tables wait
    # The process has work (a backlog, or sends it keeps up with as they come): the dispatcher's, whose
    # VACUUMs and ANALYZEs run on its one SQL thread in front of its claims (an ANALYZE of `notifications`
    # held every claim of a dispatcher for 1.0-1.5 s during a broadcast, measured). While it works and
    # the tables are tended (a live scheduler, whose janitor runs between its batches and never holds
    # back; or autovacuum, which vacuumed one of them in the last TENDED_SECONDS), a table is due only past
    # `busy_factor` times its threshold and stale statistics are left to them. Nobody tending them, it
    # vacuums and analyzes as any janitor.
    working: Callable[[], bool] = lambda: False
    busy_factor: float = 1.0
    deferred: tuple[str, ...] = field(default_factory=deferred_tables)
    _last: float = field(default=float("-inf"), init=False)
    analyzed: list[str] = field(default_factory=list, init=False)  # by the last look, beside the vacuumed
    summarized: int = field(default=0, init=False)  # BRIN block ranges the last look summarised

    def due(self, stats: list[tuple[str, int, int]], *, factor: float = 1.0) -> list[str]:
        """The tables among `(name, dead, live)` rows that should be vacuumed now (`factor` times the
        threshold, while busy)."""
        return [name for name, dead, live in stats if dead >= factor * (self.min_dead + self.live_fraction * live)]

    def stale(self, stats: list[tuple[str, int, int]]) -> list[str]:
        """The tables among `(name, rows changed since analyzed, rows the statistics know of)` whose
        statistics are stale."""
        return [name for name, changed, known in stats if changed >= self.analyze_min + self.analyze_fraction * known]

    def maybe_vacuum(self, conn) -> list[str]:  # noqa: ANN001 - an autocommit psycopg connection
        """Vacuum the due tables if `every` seconds have passed and no other process holds the lock.
        Returns the tables vacuumed."""
        now = self.clock()
        if now - self._last < self.every:
            return []
        self._last = now
        return vacuum_if_needed(conn, self)


_STATS = """
SELECT s.relname, s.n_dead_tup, s.n_live_tup,
       -- rows changed since the statistics: a churning table's churn (a queue's insert and delete of
       -- each row) leaves its statistics as true as they were; its size moving away from what they
       -- know (pg_class.reltuples, as of the last ANALYZE or VACUUM; -1: never) makes them stale
       CASE WHEN s.relname = ANY(%(churning)s) THEN abs(s.n_live_tup - greatest(c.reltuples, 0))::bigint
            ELSE s.n_mod_since_analyze END,
       greatest(c.reltuples, 0)::bigint,
       -- vacuumed lately by autovacuum: tended (a working janitor holds back)
       coalesce(s.last_autovacuum > now() - %(tended)s * interval '1 second', false)
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = current_schema() AND (s.relname = ANY(%(churning)s) OR s.n_mod_since_analyze > 0)
"""


def vacuum_if_needed(conn, janitor: Janitor) -> list[str]:  # noqa: ANN001
    """Vacuum (and so analyze) the due churning tables, analyze the other stale ones; return the
    vacuumed (`janitor.analyzed` lists the others analyzed)."""
    stats = conn.execute(_STATS, {"churning": list(janitor.tables), "tended": TENDED_SECONDS}).fetchall()
    if janitor.busy():
        stats = [row for row in stats if row[0] not in janitor.deferred]
    # Working, a janitor with a busy_factor holds back while somebody else tends the tables.
    holding = janitor.busy_factor > 1.0 and janitor.working() and _tended(stats, janitor.tables)
    due = [name for name, dead, live, *_ in stats if name in janitor.tables
           and janitor.due([(name, dead, live)], factor=janitor.busy_factor if holding else 1.0)]  # fmt: skip
    stale = [] if holding else [
        name for name in janitor.stale([(name, changed, known) for name, _, _, changed, known, _ in stats])
        if name not in due
    ]  # fmt: skip
    janitor.analyzed = []
    janitor.summarized = summarize_brin(conn, [name for name, _, _, changed, _, _ in stats if changed > 0])
    if not due and not stale:
        return []
    pooled = pooling.pooled()
    if not pooled:
        (locked,) = conn.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY]).fetchone()
        if not locked:
            return []
    skip = ", SKIP_LOCKED" if pooled else ""
    try:
        done = _each(conn, due, "VACUUM (ANALYZE, TRUNCATE false" + skip + ") {}", "vacuumed")
        janitor.analyzed = _each(conn, stale, "ANALYZE" + (" (SKIP_LOCKED)" if pooled else "") + " {}", "analyzed")
        return done
    finally:
        if not pooled:
            conn.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])


def _tended(stats: list[tuple], tables: Sequence[str]) -> bool:
    """Autovacuum vacuumed one of the churning `tables` lately, or a scheduler is alive (its janitor
    looks between its batches and never holds back; the worker registry's rule of alive)."""
    if any(row[5] for row in stats if row[0] in tables):
        return True
    from queueing.models import Worker

    return Worker.objects.live().filter(kind=Worker.Kind.SCHEDULER).exists()


# Every full block range of each BRIN index of the given tables, summarised if it is not yet (a range
# already summarised costs a look in the index's range map). The last, partial range is left alone:
# once summarised, every insert beyond its maximum would rewrite its summary (a WAL record per row).
_SUMMARIZE = """
    SELECT coalesce(sum(brin_summarize_range(x.indexrelid, r.n * p.pages)), 0)::int
    FROM pg_index x
    JOIN pg_class ic ON ic.oid = x.indexrelid
    JOIN pg_am am ON am.oid = ic.relam AND am.amname = 'brin'
    JOIN pg_class t ON t.oid = x.indrelid AND t.relkind = 'r'
    CROSS JOIN LATERAL (
        SELECT coalesce((SELECT o.option_value::int FROM pg_options_to_table(ic.reloptions) o
                         WHERE o.option_name = 'pages_per_range'), 128) AS pages
    ) p
    CROSS JOIN LATERAL generate_series(
        0, pg_relation_size(t.oid) / current_setting('block_size')::int / p.pages - 1) AS r(n)
    WHERE t.relnamespace = current_schema()::regnamespace AND t.relname = ANY(%s)
"""
SUMMARIZE_LOCK_TIMEOUT = "100ms"  # VACUUM (autovacuum's or a peer's) holds the table: summarise at the next look


def summarize_brin(conn, tables: Sequence[str]) -> int:  # noqa: ANN001 - an autocommit psycopg connection
    """Summarise the full block ranges of the BRIN indexes of `tables` (those whose rows changed since
    their statistics): a BRIN index's inserts write nothing to it, and a range no summary covers is
    read by every scan, so without this on a server with autovacuum off (whose VACUUM would do it),
    the dashboard's last hour of attempts read the whole day. Returns the ranges summarised."""
    if not tables:
        return 0
    try:
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{SUMMARIZE_LOCK_TIMEOUT}'")
            (summarized,) = conn.execute(_SUMMARIZE, [list(tables)]).fetchone()
    except (psycopg.errors.LockNotAvailable, psycopg.errors.InsufficientPrivilege) as exc:
        logger.debug("BRIN summaries wait for the next look (%s)", exc)
        return 0
    if summarized:
        logger.info("summarised %d BRIN block range(s)", summarized)
    return summarized


def _each(conn, tables: list[str], statement: str, done_as: str) -> list[str]:  # noqa: ANN001
    done = []
    for table in tables:
        started = time.perf_counter()
        conn.execute(sql.SQL(statement).format(sql.Identifier(table)))
        done.append(table)
        logger.info("%s %s in %.0f ms", done_as, table, (time.perf_counter() - started) * 1000)
    return done


def vacuum_on_default(janitor: Janitor, using: str = "default") -> list[str]:
    """`janitor.maybe_vacuum` on Django's connection (autocommit, outside any transaction: VACUUM
    cannot run inside one), for a process whose SQL all runs on one thread; nothing inside a transaction."""
    from django.db import connections

    connection = connections[using]
    if connection.in_atomic_block:
        return []
    connection.ensure_connection()
    return janitor.maybe_vacuum(connection.connection)
