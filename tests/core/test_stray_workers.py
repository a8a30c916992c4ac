"""The test suite's safety net: workers a failed test left running are found and killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.support.workers import descendants, reap_stray_workers

SLEEP = "import time; time.sleep(60)"


def test_long_running_workers_below_this_process_are_killed_and_nothing_else():
    worker = subprocess.Popen([sys.executable, "-c", SLEEP, "manage.py", "run_dispatcher"])  # noqa: S603
    # a worker started by a helper process: a grandchild of the test
    helper = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c",
         "import subprocess, sys, time; "
         f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}, 'manage.py', 'run_scheduler']); time.sleep(60)"],
    )  # fmt: skip
    bystander = subprocess.Popen([sys.executable, "-c", SLEEP, "manage.py", "prune"])  # noqa: S603
    try:
        deadline = time.monotonic() + 10
        while len(descendants(helper.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        (grandchild,) = descendants(helper.pid)
        reaped = reap_stray_workers()
        assert sorted(reaped) == sorted([worker.pid, grandchild])
        assert worker.pid not in descendants(os.getpid())
        assert grandchild not in descendants(os.getpid())
        assert helper.poll() is None and bystander.poll() is None  # not workers: left alone
        assert reap_stray_workers() == []
    finally:
        for proc in (worker, helper, bystander):
            proc.kill()
            proc.wait()
