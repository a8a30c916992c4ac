"""`manage.py omnipost_bench` (issue 8) run for real: its own receiver and dispatcher processes on the
test database, small sizes. The figures are not asserted (speed is measured in benchmarks, not
tests); what it reports and when it fails are."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from notifications.models import DeliveryAttempt, Notification
from tests.benchmarks.test_versus import versus
from tests.queueing.dispatch_support import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def bench(env: dict, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "bench.json"
    proc = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "omnipost_bench", *args, "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    return proc, json.loads(out.read_text()) if out.exists() else []


def test_end_to_end_delivers_everything_once_and_reports_its_figures(subprocess_env, tmp_path):
    proc, [result] = bench(
        subprocess_env, tmp_path, "-n", "400", "-p", "2", "-c", "50", "-b", "20", "--receiver-error-rate", "0.1"
    )
    assert proc.returncode == 0, proc.stderr
    assert result["ok"] and (result["delivered"], result["duplicates"], result["lost"]) == (400, 0, 0)
    assert result["delivered_per_second"] > 0 and result["steady_per_second"] > 0
    assert result["enqueue_per_second"] > 0 and set(result["latency_ms"]) == {"p50", "p95", "p99", "max"}
    # A claim and a record per batch, not per item: per item would be ≥ 2. The figure also counts the
    # idle polls and janitor passes while the last retries wait out their backoff (0.4–1.1 a delivery
    # here, more on a slower machine, where the wait is longer), hence the margin.
    assert 0 < result["statements_per_delivery"] < 1.5
    for label in ("delivery rate", "delivery rate, middle 80 %", "latency p99", "duplicates", "lost"):
        assert label in proc.stdout
    # every bench notification was really delivered, each with its attempt rows (503s were retried)
    assert Notification.objects.filter(status="delivered").count() == 400
    assert DeliveryAttempt.objects.filter(outcome="delivered").count() == 400
    assert DeliveryAttempt.objects.filter(outcome="transient_error").exists()


def test_the_phase_gate_brackets_the_delivery_while_the_dispatchers_run(subprocess_env, tmp_path):
    """bench/per_delivery.py measures between the two phases: the first comes once everything is
    enqueued and nothing delivered, the second once the queue is empty, the dispatchers still up."""
    import os

    from django.db import connection

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    seen = []

    def gate(phase: str, pids: list[int]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM queue_state")
            depth = cursor.fetchone()[0]
        delivered = Notification.objects.filter(status="delivered").count()
        seen.append((phase, depth, delivered, len(pids), all(alive(pid) for pid in pids)))

    out = tmp_path / "bench.json"
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "manage.py", "omnipost_bench", "-n", "300", "-p", "2", "-c", "50", "-b", "20",
         "--phase-gate", "--json", str(out)],
        cwd=ROOT, env=subprocess_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        versus.follow_phase_gate(proc, gate, time.time() + 180)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert seen == [("delivering", 300, 0, 2, True), ("drained", 0, 300, 2, True)]
    assert json.loads(out.read_text())[0]["delivered"] == 300


def test_queue_only_claims_and_acks_every_item_above_the_depth(subprocess_env, tmp_path):
    proc, [result] = bench(subprocess_env, tmp_path, "--queue-only", "-n", "2000", "-p", "2", "-b", "100",
                           "--depth", "500")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (result["mode"], result["delivered"], result["depth"]) == ("queue-only", 2000, 500)
    assert result["delivered_per_second"] > 0 and "claim+ack rate" in proc.stdout


def test_bad_sizes_exit_non_zero_with_one_line(subprocess_env, tmp_path):
    proc, results = bench(subprocess_env, tmp_path, "-n", "0")
    assert proc.returncode != 0 and not results
    assert proc.stderr.strip().splitlines()[-1] == "CommandError: --notifications must be at least 1"
