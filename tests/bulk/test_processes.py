"""A bulk send under real processes: the scheduler creating its chunks and a dispatcher sending them are
each killed with SIGKILL during the job; the job still completes with exactly one notification per
row, each delivered."""

from __future__ import annotations

import os
import signal

import pytest

from bulk.models import BulkSend
from notifications.models import Notification
from tests.bulk.test_api import csv_text, upload
from tests.queueing.dispatch_support import start_dispatchers, wait_started
from tests.queueing.scheduler_support import start_scheduler, wait_for_text, wait_until
from tests.support.web import stop_all

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

ROWS = 3000



def test_each_row_once_after_the_scheduler_and_the_dispatcher_are_killed(api_a, setup_a, subprocess_env, tmp_path):
    bulk = upload(api_a, csv_text(ROWS)).json()
    assert bulk["status"] == "ready"
    procs = []
    try:
        scheduler = start_scheduler(subprocess_env, tmp_path / "s0.log", "--interval", "0.2")
        procs.append(scheduler)
        wait_for_text(tmp_path / "s0.log", "scheduler ready", scheduler)
        dispatchers = start_dispatchers(1, subprocess_env, "--batch-size", "100", log_dir=tmp_path)
        procs += dispatchers
        assert wait_started(tmp_path, 1)
        assert api_a.post(f"/api/v1/bulk-sends/{bulk['id']}/start").status_code == 202

        def done() -> int:
            return BulkSend.objects.values_list("rows_done", flat=True).get()

        wait_until(lambda: done() >= 1000, 60, "the first chunk", interval=0.01)
        os.kill(scheduler.pid, signal.SIGKILL)  # mid-job, perhaps mid-chunk
        scheduler.wait(timeout=10)
        killed_at = done()
        assert killed_at < ROWS, "the job finished before the kill: nothing was tested"
        wait_until(lambda: Notification.objects.filter(status="delivered").exists(), 60, "a delivery")
        os.kill(dispatchers[0].pid, signal.SIGKILL)
        dispatchers[0].wait(timeout=10)

        again = start_scheduler(subprocess_env, tmp_path / "s1.log", "--interval", "0.2")
        procs.append(again)
        log_dir = tmp_path / "second"
        log_dir.mkdir()
        procs += start_dispatchers(1, subprocess_env, "--batch-size", "100", log_dir=log_dir)
        wait_until(lambda: BulkSend.objects.get().status == "completed", 120, "the job's completion")
        wait_until(lambda: Notification.objects.filter(status="delivered").count() == ROWS, 180, "every delivery")
    finally:
        stop_all(procs)
    rows = sorted(Notification.objects.filter(bulk_send_id=bulk["id"]).values_list("bulk_row", flat=True))
    assert rows == list(range(1, ROWS + 1))  # each row exactly once
    progress = api_a.get(f"/api/v1/bulk-sends/{bulk['id']}").json()["progress"]
    assert progress == {"created": ROWS, "delivered": ROWS, "failed": 0, "suppressed": 0, "pending": 0}
