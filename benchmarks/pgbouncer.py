"""A private PgBouncer for tests and the chaos soak: Debian's `pgbouncer` (1.18) in transaction pooling mode, its
configuration, log and sockets in a temporary directory, listening on the addresses a test names
(loopback, or the host side of network namespaces' veth pairs, tests.support.netns) on a free port,
in front of one PostgreSQL server. Every database name goes through (`* =` fallback).

As root the bouncer runs as the `postgres` system user (it refuses to run as root). The process is
stopped and its directory removed on exit. `make pgbouncer` starts the same configuration
(scripts/pgbouncer.sh) for local use. The soak's faults: `kill()` (SIGKILL, no goodbye to any
client) then `start()` again on the same port; `repoint(port)` after a failover (the configuration
rewritten and reloaded: clients keep their connections, new server connections go to the new
primary).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks.pgserver import free_port


def binary() -> str:
    found = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
    if found is None:
        raise RuntimeError("no pgbouncer binary; scripts/ensure_test_services.sh installs Debian's")
    return found


class PrivatePgBouncer:
    """`url(dbname)`, `show(what)` (the admin console's SHOW); a context manager that stops it."""

    def __init__(
        self,
        server_url: str,
        *,
        listen: Sequence[str] = ("127.0.0.1",),
        port: int | None = None,
        pool_size: int = 20,
        max_client_conn: int = 1000,
        server_login_retry: float = 15,
    ) -> None:
        server = urlsplit(server_url)
        self.server_host = server.hostname or "127.0.0.1"
        self.server_port = server.port or 5432
        self.user = server.username or "postgres"
        self.password = server.password or ""
        self.listen = list(listen)
        self.port = port or free_port()
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        # after a failed login to the server, how long every client is refused (PgBouncer's default
        # 15 s; the soak's is 1 s, so that a restart or failover of the server costs seconds, not 15)
        self.server_login_retry = server_login_retry
        self.root = Path(tempfile.mkdtemp(prefix="omnipost-pgbouncer-"))
        self.log = self.root / "pgbouncer.log"
        self.proc: subprocess.Popen | None = None
        self._write_config()

    def _write_config(self) -> None:
        (self.root / "userlist.txt").write_text(f'"{self.user}" "{self.password}"\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = {','.join(self.listen)}\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            "auth_type = trust\n"
            f"auth_file = {self.root / 'userlist.txt'}\n"
            f"admin_users = {self.user}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_client_conn}\n"
            f"server_login_retry = {self.server_login_retry:g}\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.root / 'pgbouncer.pid'}\n"
        )
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, user.pw_uid, user.pw_gid)

    def start(self, timeout: float = 15) -> PrivatePgBouncer:
        command = [binary(), str(self.root / "pgbouncer.ini")]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # noqa: S603
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}): {self.log_text()[-2000:]}")
            try:
                socket.create_connection((self.listen[0], self.port), timeout=0.5).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not listen: {self.log_text()[-2000:]}") from None
                time.sleep(0.05)

    def pid(self) -> int | None:
        """The bouncer's own process (under `runuser` as root), from its pidfile; None when not running."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        try:
            return int((self.root / "pgbouncer.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self, timeout: float = 10) -> None:
        """SIGKILL the bouncer: every client connection breaks at once, as in a crash."""
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError):  # a killed bouncer leaves it; a fresh start needs none
            (self.root / "pgbouncer.pid").unlink()

    def repoint(self, port: int, host: str | None = None) -> None:
        """Send new server connections to another server (the promoted standby): the configuration
        rewritten and RELOADed on the admin console; the pool's connections to the old server are
        closed as they come free."""
        self.server_port = port
        self.server_host = host or self.server_host
        self._write_config()
        if self.pid() is not None:
            import psycopg

            with psycopg.connect(self.url("pgbouncer"), autocommit=True) as conn:
                psycopg.ClientCursor(conn).execute("RELOAD")

    def log_text(self) -> str:
        try:
            return self.log.read_text()
        except OSError:
            return ""

    def url(self, dbname: str, *, host: str | None = None) -> str:
        auth = f"{self.user}:{self.password}" if self.password else self.user
        return f"postgres://{auth}@{host or self.listen[0]}:{self.port}/{dbname}"

    def show(self, what: str) -> list[dict]:
        """`SHOW <what>` on the admin console (simple protocol, as it requires): rows as dicts."""
        import psycopg

        with psycopg.connect(self.url("pgbouncer"), autocommit=True) as conn:
            cursor = psycopg.ClientCursor(conn)
            cursor.execute(f"SHOW {what}")  # what: a fixed word of the test's, not input
            names = [c.name for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)

    def __enter__(self) -> PrivatePgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
