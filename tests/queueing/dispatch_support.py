"""Starting real dispatcher processes for tests."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_dispatchers(
    count: int, env: dict, *args: str, log_dir: Path | None = None, bench: bool = False
) -> list[subprocess.Popen]:
    """`run_dispatcher` processes; `bench`: through the benchmarks' entry point instead (which also
    takes --go-file and --stats-file)."""
    command = ["-m", "benchmarks.dispatcher"] if bench else ["manage.py", "run_dispatcher"]
    procs = []
    for i in range(count):
        stderr = open(log_dir / f"dispatcher{i}.log", "w") if log_dir else subprocess.DEVNULL  # noqa: SIM115
        procs.append(
            subprocess.Popen(  # noqa: S603
                [sys.executable, *command, "--no-jitter", *args],
                cwd=ROOT, env=env, stdout=stderr, stderr=stderr,
            )
        )
    return procs


def start_forked_dispatchers(count: int, env: dict, *args: str) -> subprocess.Popen:
    """`count` `run_dispatcher` processes forked by one that started Python and Django once
    (tests.queueing.fork_dispatchers): on two cores, twenty start-ups take most of a minute."""
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "tests.queueing.fork_dispatchers", str(count), "manage.py", "run_dispatcher",
         "--no-jitter", *args],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def wait_exit(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes.append(-9)
    return codes


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_started(log_dir: Path, count: int, timeout: float = 30) -> bool:
    """Until `count` dispatcher logs say they started (signal handlers are installed by then)."""
    def started() -> int:
        return sum("started (concurrency" in p.read_text() for p in log_dir.glob("dispatcher*.log"))

    return wait_until(lambda: started() >= count, timeout)


def drain(env: dict, log_dir: Path, until=None, timeout: float = 60, batch_size: int = 50) -> None:  # noqa: ANN001
    """Run one real dispatcher process until `until()` holds (by default: the queue is empty), then
    stop it (SIGTERM, exit 0)."""
    if until is None:
        from queueing.models import QueueItem

        def until() -> bool:
            return not QueueItem.objects.exists()

    log_dir.mkdir()
    procs = start_dispatchers(1, env, "--batch-size", str(batch_size), log_dir=log_dir)
    try:
        assert wait_started(log_dir, 1)
        assert wait_until(until, timeout)
    finally:
        for proc in procs:
            proc.terminate()
        assert wait_exit(procs, 20) == [0]
