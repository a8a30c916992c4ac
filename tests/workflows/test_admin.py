"""The console shows a run's steps as a timeline linking each step's notification; staff see only
their tenants' runs."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from core.management.commands.create_staff_user import operators_group
from core.models import TenantMembership
from queueing.scheduler import Scheduler
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db


def login(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


def test_a_run_shows_its_steps_as_a_timeline_to_its_tenants_staff_only(api_a, tenant_a, tenant_b):
    steps = [{"name": "hello", "type": "send", "channel": "in_app", "body": "Hi"},
             {"name": "wait", "type": "delay", "seconds": 60}]  # fmt: skip
    assert api_a.post("/api/v1/workflows", {"key": "welcome", "steps": steps}, format="json").status_code == 201
    assert api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["jane"]}, format="json").status_code == 202
    Scheduler(jitter=0).run_once()
    run = WorkflowRun.objects.get()
    notification_id = run.steps[0]["notification_id"]

    root = login(get_user_model().objects.create_superuser("root", "root@example.test", "pw-unused-123"))
    page = root.get(f"/admin/workflows/workflowrun/{run.pk}/change/").content.decode()
    assert f"/admin/notifications/notification/{notification_id}/change/" in page
    assert "waiting" in page and "resumes at" in page
    assert "welcome" in root.get("/admin/workflows/workflowrun/").content.decode()

    for name, tenant, seen in (("ann", tenant_a, True), ("bob", tenant_b, False)):
        staff = get_user_model().objects.create_user(name, f"{name}@example.test", "pw-unused-123", is_staff=True)
        staff.groups.add(operators_group())
        TenantMembership.objects.create(user=staff, tenant=tenant)
        response = login(staff).get(f"/admin/workflows/workflowrun/{run.pk}/change/")
        assert (response.status_code == 200) is seen, (name, response.status_code)
        assert (str(run.pk) in login(staff).get("/admin/workflows/workflowrun/").content.decode()) is seen
