"""/readyz beyond database and migrations: scheduler lag past a threshold (503) and stale workers
(reported, never 503)."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.test import Client
from django.utils import timezone

from omnipost_site.ops import health
from queueing.models import ScheduledJob, Worker
from tests import factories

pytestmark = pytest.mark.django_db


def ready() -> tuple[int, dict]:
    response = Client().get("/readyz")
    return response.status_code, response.json()


def late_job(tenant, seconds: float) -> ScheduledJob:
    n = factories.notifications(tenant, factories.provider(tenant), 1, status="scheduled")[0]
    run_at = timezone.now() - timedelta(seconds=seconds)
    return ScheduledJob.objects.create(tenant=tenant, notification_id=n.pk, run_at=run_at)


def test_ready_reports_every_check_and_the_workers():
    Worker.objects.create(kind="dispatcher", host="web-1", pid=10)
    status, body = ready()
    assert status == 200
    assert body == {
        "status": "ready",
        "checks": {"database": "ok", "migrations": "ok", "scheduler": "ok"},
        "workers": {"live": 1, "stale": 0, "stale_by_kind": {"dispatcher": 0, "scheduler": 0}},
        "warnings": [],
    }


def test_a_job_due_just_now_is_not_lag(tenant_a):
    late_job(tenant_a, 5)
    assert ready()[0] == 200


def test_scheduler_lag_past_the_threshold_is_503(tenant_a, settings):
    settings.OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS = 60
    late_job(tenant_a, 300)
    status, body = ready()
    assert status == 503 and body["status"] == "not_ready"
    assert body["checks"]["scheduler"].startswith("lagging: the oldest due job waits 30")
    assert body["checks"]["scheduler"].endswith("(limit 60s)")
    # Executed or cancelled jobs are not lag, however old.
    ScheduledJob.objects.update(status="executed")
    assert ready()[0] == 200


def test_threshold_from_settings_and_zero_turns_it_off(tenant_a, settings):
    late_job(tenant_a, 300)
    settings.OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS = 600
    assert ready()[0] == 200
    settings.OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS = 0
    status, body = ready()
    assert status == 200 and body["checks"]["scheduler"] == "ok"
    settings.OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS = 120.5
    assert health.max_scheduler_lag() == 120.5
    assert ready()[0] == 503


def test_threshold_default_comes_from_the_environment_variable():
    from omnipost_site.config import number

    class Env:
        def str(self, name, default=""):
            return {"OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS": "90"}.get(name, default)

    assert number(Env(), "OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS", 60.0, minimum=0) == 90.0


def test_stale_workers_are_a_warning_not_a_503():
    now = timezone.now()
    Worker.objects.create(kind="dispatcher", host="box-1", pid=11)
    stale = Worker.objects.create(kind="dispatcher", host="box-2", pid=12)
    Worker.objects.filter(pk=stale.pk).update(last_seen=now - timedelta(minutes=5))
    gone = Worker.objects.create(kind="scheduler", host="box-3", pid=13, stopped_at=now)
    Worker.objects.filter(pk=gone.pk).update(last_seen=now - timedelta(hours=1))  # stopped cleanly: not stale

    status, body = ready()
    assert status == 200 and body["status"] == "ready"
    assert body["workers"] == {"live": 1, "stale": 1, "stale_by_kind": {"dispatcher": 1, "scheduler": 0}}
    assert body["warnings"] == ["1 stale worker(s): no heartbeat for over 60s (their leases expire by themselves)"]


def test_unauthenticated_readyz_names_no_worker_host_or_pid():
    """Anyone can read /readyz: it counts stale workers, never says which host and pid went quiet."""
    now = timezone.now()
    for n, kind in enumerate(["dispatcher", "dispatcher", "scheduler"]):
        stale = Worker.objects.create(kind=kind, host=f"db-secret-host-{n}.internal", pid=40_000 + n)
        Worker.objects.filter(pk=stale.pk).update(last_seen=now - timedelta(minutes=5))
    response = Client().get("/readyz")
    assert response.status_code == 200
    text = response.content.decode()
    assert "db-secret-host" not in text and "internal" not in text
    assert not any(str(40_000 + n) in text for n in range(3))
    assert response.json()["workers"] == {"live": 0, "stale": 3, "stale_by_kind": {"dispatcher": 2, "scheduler": 1}}


def test_unapplied_migrations_skip_the_table_checks():
    with mock.patch("django.db.migrations.executor.MigrationExecutor.migration_plan", return_value=[("m", False)]):
        status, body = ready()
    assert status == 503
    assert body == {"status": "not_ready", "checks": {"database": "ok", "migrations": "1 unapplied"}}
