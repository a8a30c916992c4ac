"""Worker processes a test started and did not stop: found under this process and killed.

A process test that fails half-way (an assertion before its `wait_exit`) used to leave its
dispatchers running against the shared test database, where they claimed the next tests' rows and
made every later process test fail too: one failure read as a dozen. `reap_stray_workers` runs
after every test that can start workers (the teardown of the `subprocess_env` fixture, which they all
take; ≈ 8 ms a call, so not after every test).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

# manage.py commands that run until stopped (a test's own one-shot commands exit by themselves)
LONG_RUNNING = (b"run_dispatcher", b"run_scheduler", b"run_all", b"run_bounce_listener")


def descendants(root: int) -> list[int]:
    """Live (not zombie) processes below `root`, any depth. Empty where there is no /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone in the meantime
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if state != "Z":
            parents[int(entry.name)] = int(ppid)
    found, frontier = [], {root}
    while frontier:
        children = {pid for pid, ppid in parents.items() if ppid in frontier}
        found.extend(children)
        frontier = children
    return found


def is_long_running_worker(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"manage.py" in argv and any(name in argv for name in LONG_RUNNING)


def reap_stray_workers(root: int | None = None, *, timeout: float = 5.0) -> list[int]:
    """Kill (SIGKILL) the long-running workers below `root` (this process by default) and wait
    until they are gone; returns their pids."""
    root = root or os.getpid()
    strays = [pid for pid in descendants(root) if is_long_running_worker(pid)]
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout
    while True:
        for pid in strays:
            try:  # a direct child is reaped here; a grandchild by its own parent or by init
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if not set(strays) & set(descendants(root)) or time.monotonic() >= deadline:
            return strays
        time.sleep(0.05)
