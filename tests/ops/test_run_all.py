"""`make run` smoke test: run_all on a fresh checkout (no DATABASE_URL: the embedded PostgreSQL server
in a throwaway var/) serves the admin and docs; Ctrl-C stops every process and the embedded server
within 10 s; the next run_all finds the same data."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from core.embedded_db import EmbeddedPostgres
from tests.core.conftest import REPO
from tests.support.embedded import alive, embedded_env, postmasters, temporary_var


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fetch(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback only
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(url: str, proc: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run_all exited early with {proc.returncode}")
        try:
            if fetch(url, timeout=1.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer in time")


def start_run_all(var: Path, port: int, logs: Path) -> subprocess.Popen:
    with (logs / "stdout.log").open("a") as out, (logs / "stderr.log").open("a") as err:
        return subprocess.Popen(  # noqa: S603
            [sys.executable, str(REPO / "manage.py"), "run_all", "--bind", f"127.0.0.1:{port}"],
            cwd=logs,  # run_all must not depend on the working directory
            env=embedded_env(var),
            stdout=out,
            stderr=err,
        )


def ctrl_c(proc: subprocess.Popen, server: EmbeddedPostgres, logs: Path) -> float:
    """SIGINT to run_all; the seconds until it, its children and the embedded server are all gone."""
    children = children_of(proc.pid)
    postmaster = server.pid()
    assert postmaster is not None and len(children) == 3, children  # web, scheduler, dispatcher
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0, (logs / "stderr.log").read_text()[-3000:]
    while (postmasters(server.data_dir) or [p for p in children if alive(p)]) and time.monotonic() - began < 15:
        time.sleep(0.05)
    return time.monotonic() - began


def authorized(url: str, key: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback only
        return json.loads(response.read())


@pytest.mark.slow
def test_run_all_serves_stops_everything_on_ctrl_c_and_finds_its_data_again(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    developers_var = sorted((REPO / "var").glob("*")) if (REPO / "var").exists() else []
    with temporary_var() as var:
        server = EmbeddedPostgres(var)
        proc = start_run_all(var, port, tmp_path)
        try:
            wait_for(f"{base}/healthz", proc, time.monotonic() + 120)
            # The banner is on stdout while the server runs, not only after it exits.
            banner = (tmp_path / "stdout.log").read_text()
            password = re.search(r"user 'admin' password '([^']+)'", banner)
            api_key = re.search(r"API key: (op_[A-Za-z0-9]{8}_[A-Za-z0-9]{32,})", banner)
            assert password and api_key and "Created the demo tenant" in banner, banner
            key = api_key[1]
            assert f"curl -s {base}/api/v1/notifications -H 'Authorization: Bearer {key}'" in banner

            status, html = fetch(f"{base}/admin/login/")
            assert status == 200
            title = re.search(r"<title>(.*?)</title>", html, re.S)[1]
            assert "OmniPost operations" in title
            assert fetch(f"{base}/api/docs/")[0] == 200
            assert authorized(f"{base}/api/v1/tenant", key)["name"] == "demo"
            # OMNIPOST_PUBLIC_URL defaults to the server's own address: providers name their events_url under it.
            providers = authorized(f"{base}/api/v1/providers", key)["results"]
            assert providers and all(p["events_url"] == f"{base}/hooks/providers/{p['id']}" for p in providers)
            sent = authorized(f"{base}/api/v1/notifications", key, {"channel": "email", "recipient": "a@example.com",
                                                                    "subject": "Hi", "body": "kept"})  # fmt: skip

            assert ctrl_c(proc, server, tmp_path) < 10
            assert server.pid() is None and postmasters(server.data_dir) == []
            log = (tmp_path / "stdout.log").read_text()
            # A worker still starting (no handler yet) dies of the SIGTERM (-15), which run_all counts as
            # stopped; test_make_run, which waits for both workers to be live, asserts 0 for each.
            assert re.search(r"stopped \(web 0, scheduler (0|-15), dispatcher (0|-15)\)", log), log
            assert f"stopped the embedded PostgreSQL server ({server.data_dir})" in log
            with pytest.raises(OSError):
                fetch(f"{base}/healthz", timeout=1.0)  # nothing left listening

            # The next run: the same tenant, key and notification, from the same var/postgres.
            proc = start_run_all(var, port, tmp_path)
            wait_for(f"{base}/healthz", proc, time.monotonic() + 120)
            again = (tmp_path / "stdout.log").read_text()[len(log):]
            assert "Using the demo tenant" in again and f"API key: {key}" in again, again
            detail = authorized(f"{base}/api/v1/notifications/{sent['id']}", key)
            assert detail["id"] == sent["id"] and detail["channel"] == "email"
            assert ctrl_c(proc, server, tmp_path) < 10
            assert postmasters(server.data_dir) == []
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    errors = (tmp_path / "stderr.log").read_text()
    assert "Traceback" not in errors, errors
    assert (sorted((REPO / "var").glob("*")) if (REPO / "var").exists() else []) == developers_var


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (Linux)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found
