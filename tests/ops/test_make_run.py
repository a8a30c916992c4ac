"""`make run` end to end: the supervisor on a fresh checkout (no DATABASE_URL: the embedded PostgreSQL
server, in a throwaway var/) delivers the banner's first notification through the console provider,
/metrics counts it, and Ctrl-C stops all three processes (exit 0) and the embedded server within 10 s.

Serving the admin and docs, the banner's credentials and finding the data again on the next run are
covered by test_run_all.py; this builds on its helpers."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from core.embedded_db import EmbeddedPostgres
from tests.core.conftest import REPO
from tests.ops.test_metrics import metric_value
from tests.ops.test_run_all import children_of, ctrl_c, fetch, free_port, start_run_all, wait_for
from tests.support.embedded import alive, postmasters, temporary_var


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
    stdout, stderr = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with temporary_var() as var:
        server = EmbeddedPostgres(var)
        proc = start_run_all(var, port, tmp_path)
        try:
            delivered_and_counted(proc, base, stdout, stderr)
            children = children_of(proc.pid)
            assert ctrl_c(proc, server, tmp_path) < 10
            assert postmasters(server.data_dir) == [] and not [pid for pid in children if alive(pid)]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = stdout.read_text()
    assert "stopped (web 0, scheduler 0, dispatcher 0)" in log
    assert f"stopped the embedded PostgreSQL server ({server.data_dir})" in log
    errors = stderr.read_text()
    assert "Traceback" not in errors and "jane@example.com" not in errors, errors[-3000:]


def delivered_and_counted(proc: subprocess.Popen, base: str, stdout: Path, stderr: Path) -> None:
    """The banner's curl line is answered 201, delivered by the console provider, counted in /metrics."""
    wait_for(f"{base}/healthz", proc, time.monotonic() + 120)
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
