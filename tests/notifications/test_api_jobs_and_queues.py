"""Cancel, scheduled jobs and queue figures through the API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.models import Notification
from queueing import queue
from queueing.models import QueueItem, ScheduledJob
from tests.factories import queued
from tests.support.setups import email

pytestmark = pytest.mark.django_db


# --- cancel and scheduled jobs --------------------------------------------------------------------


def test_cancel_endpoint(api_a, setup_a):
    nid = api_a.post("/api/v1/notifications", email(), format="json").json()["id"]
    response = api_a.post(f"/api/v1/notifications/{nid}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert response.json()["attempts"] == []
    again = api_a.post(f"/api/v1/notifications/{nid}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_cancellable"


def test_scheduled_jobs_list_and_delete(api_a, setup_a):
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    nid = api_a.post("/api/v1/notifications", email(scheduled_for=later), format="json").json()["id"]
    jobs = api_a.get("/api/v1/scheduled-jobs").json()["results"]
    assert [j["notification_id"] for j in jobs] == [nid] and jobs[0]["status"] == "pending"
    job_id = jobs[0]["job_id"]
    assert api_a.delete(f"/api/v1/scheduled-jobs/{job_id}").status_code == 204
    assert Notification.objects.get(pk=nid).status == "cancelled"
    assert api_a.delete(f"/api/v1/scheduled-jobs/{job_id}").status_code == 409
    nid2 = api_a.post("/api/v1/notifications", email(scheduled_for=later), format="json").json()["id"]
    ScheduledJob.objects.filter(notification_id=nid2).update(status="executed")
    response = api_a.delete(f"/api/v1/scheduled-jobs/{ScheduledJob.objects.get(notification_id=nid2).pk}")
    assert response.status_code == 409 and "executed" in response.json()["error"]["message"]


# --- queues ---------------------------------------------------------------------------------------


def test_queue_figures_are_tenant_scoped(api_a, api_b, setup_a, setup_b, django_assert_max_num_queries):
    queued(setup_a.tenant, setup_a.hook, 3, priority=1)
    queued(setup_a.tenant, setup_a.hook, 2, priority=9, queue_name="fast")
    queued(setup_a.tenant, setup_a.hook, 1, priority=1, delay=3600)
    # tenant B's queue is not A's: A never sees it, and the (tenant-fair) claim below takes one of A's
    queued(setup_b.tenant, setup_b.hook, 4, priority=0, queue_name="other")
    queue.claim(1, queues=["default"], lease_seconds=60)
    api_a.get("/api/v1/tenant")  # the key's first use records last_used_at
    with django_assert_max_num_queries(2):  # the key lookup and one grouped query
        response = api_a.get("/api/v1/queues")
    results = {q["queue"]: q for q in response.json()["results"]}
    assert set(results) == {"default", "fast"}
    default = results["default"]
    assert (default["depth"], default["ready"], default["leased"], default["delayed"]) == (4, 2, 1, 1)
    assert default["by_priority"] == {**{str(p): 0 for p in range(10)}, "1": 4}
    assert results["fast"]["by_priority"]["9"] == 2 and results["fast"]["ready"] == 2
    assert results["fast"]["oldest_age_seconds"] >= 0
    b = api_b.get("/api/v1/queues").json()["results"]
    assert [(q["queue"], q["depth"]) for q in b] == [("other", 4)]
    assert QueueItem.objects.count() == 10
