"""Real web server processes serving OmniPost on loopback ports, for tests that talk HTTP to them:
`serve` runs any command line, `gunicorn` and `granian` the usual ones. Each is up when /healthz
answers and stopped with SIGTERM (killed after 10 s) when its block ends; SIGTERM first, so that
granian stops its workers (a SIGKILL to it alone would orphan them)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.pgserver import free_port

GUNICORN = str(Path(sys.executable).with_name("gunicorn"))
ROOT = Path(__file__).resolve().parents[2]
SYNC = ("omnipost_site.wsgi:application",)
GTHREAD = ("omnipost_site.wsgi:application", "--worker-class", "gthread", "--threads", "4")
ASGI = ("omnipost_site.asgi:application", "--worker-class", "asgi")


@dataclass(frozen=True)
class Served:
    url: str
    process: subprocess.Popen


@contextmanager
def serve(command: Sequence[str], env: Mapping[str, str], port: int, *, timeout: float = 60) -> Iterator[Served]:
    """`command` (listening on loopback `port`) with OMNIPOST_PUBLIC_URL set to its own address."""
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(  # noqa: S603
        list(command), env={"OMNIPOST_LOG_LEVEL": "WARNING", **env, "OMNIPOST_PUBLIC_URL": url}, cwd=ROOT
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, f"{command[:3]} did not come up"
            time.sleep(0.1)
        yield Served(url, proc)
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then a kill after 10 s."""
    stop_all([proc], timeout=10)


def stop_all(procs: Iterable[subprocess.Popen], timeout: float = 30) -> None:
    """SIGTERM to every process still running at once, then each waited for; killed after `timeout`."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextmanager
def gunicorn(env: Mapping[str, str], app: tuple[str, ...] = GTHREAD, *, workers: int = 1) -> Iterator[Served]:
    """One gunicorn (its `workers`, `app` and worker class)."""
    port = free_port()
    command = [GUNICORN, *app, "--workers", str(workers), "--bind", f"127.0.0.1:{port}", "--log-level", "warning"]
    with serve(command, env, port, timeout=30) as served:
        yield served


def granian_command(port: int, app: str = "omnipost_site.asgi:application", interface: str = "asgi") -> list[str]:
    return [sys.executable, "-m", "granian", "--interface", interface, app, "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1", "--no-ws", "--workers-kill-timeout", "5",
            "--log-level", "warning"]  # fmt: skip


@contextmanager
def granian(env: Mapping[str, str], port: int | None = None) -> Iterator[Served]:
    """One granian ASGI process (omnipost_site.asgi, one worker) on `port` (a free one by default)."""
    port = port or free_port()
    with serve(granian_command(port), env, port, timeout=30) as served:
        yield served
