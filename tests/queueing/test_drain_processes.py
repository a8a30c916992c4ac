"""Exactly-once draining by real worker processes, and crash recovery."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from queueing import queue
from queueing.models import QueueItem
from tests import factories

ROOT = Path(__file__).resolve().parents[2]


def start_workers(count: int, out_dir: Path, env: dict, *extra: str) -> list[subprocess.Popen]:
    """`count` worker processes, forked by one that started Django once (twenty start-ups on two cores
    took most of a minute); it exits non-zero when any of them does."""
    return [
        subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "tests.queueing.drain_worker", "--processes", str(count),
             "--out", str(out_dir / "w{n}.log"), *extra],
            cwd=ROOT, env=env,
        )
    ]


def wait_all(procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        assert proc.returncode == 0


def processed(out_dir: Path) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for log in out_dir.glob("w*.log"):
        for line in log.read_text().splitlines():
            if line.startswith("P "):
                counts[line.split()[1]] += 1
    return counts


def assert_exactly_once(out_dir: Path, expected: set[str]) -> None:
    counts = processed(out_dir)
    duplicates = {k: v for k, v in counts.items() if v > 1}
    assert not duplicates, f"{len(duplicates)} items processed more than once"
    assert set(counts) == expected, f"lost {len(expected - set(counts))}"


@pytest.mark.django_db(transaction=True)
def test_twenty_processes_drain_one_hundred_exactly_once(tenant_a, subprocess_env, tmp_path):
    notes = factories.queued(tenant_a, factories.provider(tenant_a), 100)
    procs = start_workers(20, tmp_path, subprocess_env, "--batch", "3")
    wait_all(procs, 90)
    assert_exactly_once(tmp_path, {str(n.id) for n in notes})
    assert QueueItem.objects.count() == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_processes_drain_80k_exactly_once(tenant_a, subprocess_env, tmp_path):
    from notifications.models import Notification

    prov = factories.provider(tenant_a)
    factories.bulk_queued_sql(tenant_a, prov, 80_000)  # 800 claims of 100 by eight at once
    expected = {str(i) for i in Notification.objects.values_list("id", flat=True)}
    procs = start_workers(8, tmp_path, subprocess_env, "--batch", "100", "--max-seconds", "240")
    wait_all(procs, 300)
    assert_exactly_once(tmp_path, expected)
    assert QueueItem.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_killed_worker_leases_are_reclaimed_and_zombie_ack_refused(tenant_a, subprocess_env, tmp_path):
    notes = factories.queued(tenant_a, factories.provider(tenant_a), 10)
    holder_log = tmp_path / "holder.log"
    holder = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "tests.queueing.drain_worker", "--hold", "--batch", "10", "--lease", "1.5",
         "--out", str(holder_log)],
        cwd=ROOT, env=subprocess_env,
    )
    deadline = time.monotonic() + 30
    while "READY" not in (holder_log.read_text() if holder_log.exists() else ""):
        assert time.monotonic() < deadline and holder.poll() is None
        time.sleep(0.05)
    held = [line.split() for line in holder_log.read_text().splitlines() if line.startswith("L ")]
    assert len(held) == 10
    # Peers are up and idle before the kill, so what is measured is the lease, not Python's start-up.
    peers = start_workers(2, tmp_path, subprocess_env, "--batch", "5", "--idle-exit", "4")
    time.sleep(1.0)
    os.kill(holder.pid, signal.SIGKILL)
    killed_at = time.time()
    holder.wait(5)

    wait_all(peers, 60)
    assert_exactly_once(tmp_path, {str(n.id) for n in notes})
    times = [float(line.split()[2]) for log in tmp_path.glob("w*.log")
             for line in log.read_text().splitlines() if line.startswith("P ")]
    assert max(times) - killed_at < 1.5 + 2.0, "not re-claimed within lease + 2 s of the kill"

    import uuid

    zombie = [
        queue.Lease(item_id=int(i), lock_token=uuid.UUID(t), notification_id=uuid.uuid4(), tenant_id=tenant_a.pk,
                    provider_id=None, queue_name="default", priority=5, payload={}, attempts=1,
                    enqueued_at=None, locked_until=None, rate_limited=False)
        for _, i, t in held
    ]
    assert queue.ack(zombie) == set()
