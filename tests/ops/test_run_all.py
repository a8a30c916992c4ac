"""`make run` smoke test: run_all on a fresh SQLite database serves the admin and docs, then stops on Ctrl-C."""

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

import pytest

from tests.core.conftest import REPO, clean_env


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


@pytest.mark.slow
def test_run_all_serves_and_stops_cleanly_on_ctrl_c(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = clean_env(
        DEBUG="true",
        DJANGO_SETTINGS_MODULE="omnipost_site.settings",
        DATABASE_URL=f"sqlite:///{tmp_path / 'omnipost.sqlite3'}",
    )
    stdout, stderr = tmp_path / "stdout.log", tmp_path / "stderr.log"
    var = REPO / "var"
    credentials_before = set(var.glob("demo-credentials-*.json"))
    with stdout.open("w") as out, stderr.open("w") as err:
        proc = subprocess.Popen(  # noqa: S603
            [sys.executable, str(REPO / "manage.py"), "run_all", "--bind", f"127.0.0.1:{port}"],
            cwd=tmp_path,  # run_all must not depend on the working directory
            env=env,
            stdout=out,
            stderr=err,
        )
    try:
        wait_for(f"{base}/healthz", proc, time.monotonic() + 60)
        # The banner is on stdout while the server runs, not only after it exits.
        banner = stdout.read_text()
        password = re.search(r"user 'admin' password '([^']+)'", banner)
        api_key = re.search(r"API key: (op_[A-Za-z0-9]{8}_[A-Za-z0-9]{32,})", banner)
        assert password and api_key, banner
        assert f"curl -s {base}/api/v1/notifications -H 'Authorization: Bearer {api_key[1]}'" in banner

        status, html = fetch(f"{base}/admin/login/")
        assert status == 200
        title = re.search(r"<title>(.*?)</title>", html, re.S)[1]
        assert "OmniPost operations" in title
        assert fetch(f"{base}/api/docs/")[0] == 200
        request = urllib.request.Request(f"{base}/api/v1/tenant", headers={"Authorization": f"Bearer {api_key[1]}"})
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback only
            assert b'"name":"demo"' in response.read()
        # OMNIPOST_PUBLIC_URL defaults to the server's own address: providers name their events_url under it.
        request = urllib.request.Request(f"{base}/api/v1/providers", headers={"Authorization": f"Bearer {api_key[1]}"})
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback only
            providers = json.loads(response.read())["results"]
        assert providers and all(p["events_url"] == f"{base}/hooks/providers/{p['id']}" for p in providers)

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0, stderr.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # The demo credentials of this throwaway database are of no use to anyone: leave var/ as it was.
        for path in set(var.glob("demo-credentials-*.json")) - credentials_before:
            path.unlink()
    log = stdout.read_text()
    assert "stopped" in log
    errors = stderr.read_text()
    assert "Traceback" not in errors, errors
    with pytest.raises(OSError):
        fetch(f"{base}/healthz", timeout=1.0)  # nothing left listening
