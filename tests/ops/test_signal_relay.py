"""A granian worker stops on SIGTERM whichever of its threads the kernel hands the signal to
(omnipost_site.signal_relay).

The signal is sent to one of the worker's threads other than the main one (tgkill), as the kernel
may do with the SIGTERM its server sends. The application's worker stops; a plain WSGI app without
the relay, under the same server, does not (granian waits for the stop in the main thread, and only
a signal that interrupts that thread wakes it)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.core.conftest import REPO, clean_env
from tests.ops.test_run_all import fetch, free_port

PLAIN_APP = "def application(environ, start_response):\n    start_response('200 OK', [])\n    return [b'ok']\n"


def start_granian(app: str, tmp_path: Path, pythonpath: str = "") -> tuple[subprocess.Popen, int]:
    port = free_port()
    # /healthz answers without the database: the URL is never connected to
    env = clean_env(DEBUG="true", DJANGO_SETTINGS_MODULE="omnipost_site.settings",
                    DATABASE_URL="postgres://postgres:postgres@127.0.0.1:1/nowhere")  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, str(REPO)]))
    server = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "granian", "--interface", "wsgi", "--workers", "1", "--blocking-threads", "2",
         "--host", "127.0.0.1", "--port", str(port), "--no-ws", "--log-level", "warning", app],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.poll() is None, "granian exited"
        try:
            if fetch(f"http://127.0.0.1:{port}/healthz", timeout=1.0)[0] == 200:
                break
        except OSError:
            time.sleep(0.2)
    else:
        raise AssertionError("granian did not come up")
    (worker,) = children(server.pid)
    return server, worker


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def sigterm_to_another_thread(pid: int) -> int:
    """SIGTERM to one of `pid`'s threads other than its main one; that thread's id."""
    tids = sorted(int(task.name) for task in Path(f"/proc/{pid}/task").iterdir() if int(task.name) != pid)
    assert tids, "the worker has no other thread"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.tgkill(pid, tids[0], signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
    return tids[0]


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def exits_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.05)
    return False


def stop(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=10)


@pytest.mark.slow
def test_the_applications_granian_worker_stops_when_another_thread_gets_the_sigterm(tmp_path):
    server, worker = start_granian("omnipost_site.wsgi:application", tmp_path)
    try:
        sigterm_to_another_thread(worker)
        assert exits_within(worker, 10), "the worker kept running"
    finally:
        stop(server)


@pytest.mark.slow
def test_without_the_relay_the_worker_never_hears_that_sigterm(tmp_path):
    """What the relay mends: the same signal to a plain app's worker leaves it serving."""
    (tmp_path / "plain_app.py").write_text(PLAIN_APP)
    server, worker = start_granian("plain_app:application", tmp_path, pythonpath=str(tmp_path))
    try:
        sigterm_to_another_thread(worker)
        assert not exits_within(worker, 3)
        assert fetch(f"http://127.0.0.1:{server_port(server)}/", timeout=2.0)[0] == 200  # still serving
    finally:
        stop(server)


def server_port(server: subprocess.Popen) -> int:
    return int(server.args[server.args.index("--port") + 1])
