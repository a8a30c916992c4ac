"""A real gunicorn process serving OmniPost on a loopback port, for tests that talk HTTP to it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
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
def gunicorn(env: Mapping[str, str], app: tuple[str, ...] = GTHREAD, *, workers: int = 1) -> Iterator[Served]:
    """One gunicorn (its `workers`, `app` and worker class) with OMNIPOST_PUBLIC_URL set to its own
    address, up when /healthz answers; stopped with SIGTERM (killed after 10 s) when the block ends."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(  # noqa: S603
        [GUNICORN, *app, "--workers", str(workers), "--bind", f"127.0.0.1:{port}", "--log-level", "warning"],
        env={"OMNIPOST_LOG_LEVEL": "WARNING", **env, "OMNIPOST_PUBLIC_URL": url}, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "gunicorn did not come up"
            time.sleep(0.1)
        yield Served(url, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
