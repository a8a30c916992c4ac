"""A throwaway var/ for tests of the embedded PostgreSQL default, so they never touch the developer's
var/ (its server, its data, its demo credentials): processes started with `embedded_env(var)` have
no DATABASE_URL and keep their state under `var`; on exit its server is stopped and it is removed."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from core.embedded_db import EmbeddedPostgres
from tests.core.conftest import clean_env


@contextlib.contextmanager
def temporary_var() -> Iterator[Path]:
    # Under the system's temp dir, not pytest's tmp_path: its path is short enough for the socket.
    var = Path(tempfile.mkdtemp(prefix="omnipost-var-"))
    try:
        yield var
    finally:
        EmbeddedPostgres(var).stop()
        shutil.rmtree(var, ignore_errors=True)


def embedded_env(var: Path, **overrides: str) -> dict[str, str]:
    """The environment of a `make run` on a fresh checkout whose var/ is `var`."""
    return clean_env(DEBUG="true", DJANGO_SETTINGS_MODULE="omnipost_site.settings", OMNIPOST_VAR_DIR=str(var),
                     PYTHONUNBUFFERED="1", **overrides)  # fmt: skip


def postmasters(data_dir: Path) -> list[int]:
    """The pids of postmasters (not their backends, which rename themselves) serving `data_dir`."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
            parent = int((cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if argv[0].endswith(b"/postgres") and str(data_dir).encode() in argv:
            found[int(cmdline.parent.name)] = parent
    # A backend just forked still shows its postmaster's command line until it renames itself.
    return sorted(pid for pid, parent in found.items() if parent not in found)


def alive(pid: int) -> bool:
    """Running, not exited (a zombie, exited but not yet reaped by its parent, has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
