"""`make run` end to end: the supervisor on a fresh SQLite file delivers the banner's first notification
through the console provider, /metrics counts it, and Ctrl-C stops all three processes with exit 0.

Serving the admin and docs and the banner's credentials are covered by test_run_all.py; this builds on
its helpers."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.core.conftest import REPO, clean_env
from tests.ops.test_metrics import metric_value
from tests.ops.test_run_all import fetch, free_port, wait_for


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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def banner_request(banner: str) -> urllib.request.Request:
    """The request the banner's curl line sends, parsed with shell rules."""
    start = banner.index("curl ")
    end = banner.index("\n", banner.index(" -d ", start))
    words = shlex.split(banner[start:end].replace("\\\n", " "))
    url = next(w for w in words if w.startswith("http"))
    headers = dict(words[i + 1].split(": ", 1) for i, w in enumerate(words) if w == "-H")
    data = words[words.index("-d") + 1].encode()
    return urllib.request.Request(url, data=data, headers=headers, method="POST")


def get_json(url: str, key: str) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback only
        return json.loads(response.read())


@pytest.mark.slow
def test_make_run_delivers_the_first_notification_and_stops_on_ctrl_c(tmp_path):
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^run:.*\n(\t.*\n)*\t.*manage\.py run_all", makefile, re.M), "make run starts run_all"

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
            cwd=tmp_path, env=env, stdout=out, stderr=err,
        )
    try:
        wait_for(f"{base}/healthz", proc, time.monotonic() + 60)
        banner = stdout.read_text()
        key = re.search(r"API key: (op_\w+)", banner)[1]
        children = children_of(proc.pid)
        assert len(children) == 3, children  # web, scheduler, dispatcher

        with urllib.request.urlopen(banner_request(banner), timeout=10) as response:  # noqa: S310 - loopback
            assert response.status == 201
            created = json.loads(response.read())
        assert created["provider"] == "console-email" and created["recipient_masked"] == "j***@example.com"
        url = f"{base}/api/v1/notifications/{created['id']}"

        deadline = time.monotonic() + 30
        while (detail := get_json(url, key))["status"] != "delivered" and time.monotonic() < deadline:
            assert proc.poll() is None, stderr.read_text()[-3000:]
            time.sleep(0.2)
        if detail["status"] != "delivered":  # stop first: a crashed task's traceback prints on the way out
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=15)
            pytest.fail(f"not delivered: {detail['status']}\n{stderr.read_text()[-4000:]}")
        assert [a["outcome"] for a in detail["attempts"]] == ["delivered"]
        console = [line for line in stderr.read_text().splitlines() if f"console delivery of {created['id']}" in line]
        assert len(console) == 1 and "to j***@example.com" in console[0], console

        # The scheduler may still be starting (import, start-up jitter): scrape until both workers are live.
        deadline = time.monotonic() + 30
        while True:
            status, text = fetch(f"{base}/metrics")
            assert status == 200
            live = [metric_value(text, "omnipost_workers", kind=k, state="live") for k in ("dispatcher", "scheduler")]
            if live == [1, 1] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        name = "omnipost_delivery_attempts_total"
        assert metric_value(text, name, outcome="delivered", provider="console-email") == 1
        assert metric_value(text, "omnipost_delivery_latency_seconds_count") == 1
        assert metric_value(text, "omnipost_workers", kind="dispatcher", state="live") == 1
        assert metric_value(text, "omnipost_workers", kind="scheduler", state="live") == 1

        stopping = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0, stderr.read_text()[-3000:]
        assert time.monotonic() - stopping < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for path in set(var.glob("demo-credentials-*.json")) - credentials_before:
            path.unlink()
    assert "stopped (web 0, scheduler 0, dispatcher 0)" in stdout.read_text()
    assert not [pid for pid in children if alive(pid)]
    errors = stderr.read_text()
    assert "Traceback" not in errors and "jane@example.com" not in errors, errors[-3000:]
