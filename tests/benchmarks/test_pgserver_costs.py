"""What bench/per_delivery.py reads from its private server: the WAL of a window, record by record,
and the server's CPU, including the processes that ended inside the window."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from benchmarks.pgserver import PrivatePostgres, process_cpu


@pytest.fixture(scope="module")
def pg():
    with PrivatePostgres(settings={"full_page_writes": "on", "autovacuum": "off"}) as server:
        yield server


def stats_record(pg: PrivatePostgres, start: str, end: str) -> dict[str, list[int]]:
    """`pg_waldump --stats=record`'s table: type → [records, record bytes, full-page-image bytes]."""
    out = subprocess.run(  # noqa: S603
        [str(pg.bindir / "pg_waldump"), "-p", str(pg.data / "pg_wal"), "-s", start, "-e", end, "--stats=record"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    table = {}
    for line in out.splitlines():
        match = re.match(r"^(\S+/\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)", line)
        if match:
            table[match.group(1)] = [int(match.group(2)), int(match.group(3)), int(match.group(4))]
    return table


def test_the_window_s_wal_is_counted_as_pg_waldump_counts_it_and_by_relation(pg):
    pg.sql("CHECKPOINT")  # the updates below write full-page images too
    pg.sql("CREATE TABLE t (a int PRIMARY KEY, b text, c int)")
    pg.sql("CREATE INDEX t_c ON t (c)")
    start = pg.sql("SELECT pg_current_wal_insert_lsn()::text")
    pg.sql("INSERT INTO t SELECT g, repeat('x', 300), g FROM generate_series(1, 5000) g")
    pg.sql("UPDATE t SET c = c + 1 WHERE a % 3 = 0")
    end = pg.sql("SELECT pg_current_wal_insert_lsn()::text")
    pg.sql("SELECT pg_switch_wal()")  # flushed, so pg_waldump can read up to `end`

    wal = pg.wal(start, end)

    assert wal.by_type == stats_record(pg, start, end)
    assert wal.records == sum(n for n, _ in wal.by_relation.values())
    dboid = pg.sql("SELECT oid FROM pg_database WHERE datname = 'postgres'")
    heap, pkey, by_c = (pg.sql("SELECT pg_relation_filenode(%s::regclass)", [name]) for name in ("t", "t_pkey", "t_c"))

    def records(kind: str, node: int) -> int:
        return sum(n for (k, db, rel), (n, _) in wal.by_relation.items() if k.startswith(kind) and (db, rel) ==
                   (dboid, node))  # fmt: skip

    assert records("Heap/INSERT", heap) == 5000
    assert records("Heap/UPDATE", heap) == 5000 // 3  # c is indexed: no HOT update
    # an index entry is an INSERT_* record, or the SPLIT_* that makes room for it
    assert records("Btree/", pkey) >= 5000
    assert records("Btree/", by_c) >= 5000 + 5000 // 3


def test_the_server_s_cpu_counts_a_backend_that_ended_between_two_readings(pg):
    before = pg.cpu()
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert backend in pg.cpu().children
        conn.execute("SELECT sum(g) FROM generate_series(1, 3000000) g")
        spent = process_cpu(backend)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{backend}").exists() and time.monotonic() < deadline:  # until the postmaster reaps it
        time.sleep(0.01)
    after = pg.cpu()

    assert spent >= 0.05, "the query should take some CPU"
    assert backend not in after.children
    used = after.since(before)
    assert used["whole"] >= spent - 0.02  # one clock tick of rounding
    assert 0 <= used["background"] <= used["whole"]
    assert used["backends"] == pytest.approx(used["whole"] - used["background"])
