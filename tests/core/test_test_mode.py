"""Test keys and the separation of the two modes through the API: what a test key creates carries
`test: true` and is listed and read with test keys only (404 to live keys, and the other way round);
configuration is shared; workflow runs and suppressions belong to one mode; the admin tells test
notifications apart (a filter and a badge)."""

from __future__ import annotations

import io
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from core.masking import mask_text
from core.models import ApiKey
from core.models.api_keys import KEY_RE
from notifications.models import Notification
from recipients.models import Suppression
from tests import factories
from tests.conftest import client_for
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db

SEND = {"name": "hello", "type": "send", "channel": "email", "subject": "Hi", "body": "Hello"}


@pytest.fixture
def test_api(tenant_a):  # noqa: ANN001, ANN201
    raw = ApiKey.issue(tenant_a, name="test", test=True)[1]
    assert raw.startswith("op_test_") and KEY_RE.fullmatch(raw)
    return client_for(raw)


def send(api, recipient: str = "jane@example.com") -> dict:  # noqa: ANN001
    body = {"channel": "email", "recipient": recipient, "subject": "s", "body": "b"}
    response = api.post("/api/v1/notifications", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_each_key_lists_and_reads_its_own_mode_only(tenant_a, api_a, test_api):
    factories.provider(tenant_a, "mail", kind="console", channel="email", is_default=True, config={})
    live, test = send(api_a), send(test_api)
    batch = test_api.post("/api/v1/notifications/batch", {"notifications": [
        {"channel": "email", "recipient": "a@example.com", "subject": "s", "body": "b"}]}, format="json")  # fmt: skip
    assert batch.status_code == 201, batch.content
    assert (live["test"], test["test"]) == (False, True)
    assert Notification.objects.filter(test=True).count() == 2
    assert [n["id"] for n in api_a.get("/api/v1/notifications").json()["results"]] == [live["id"]]
    assert live["id"] not in {n["id"] for n in test_api.get("/api/v1/notifications").json()["results"]}
    assert test_api.get(f"/api/v1/notifications/{test['id']}").json()["test"] is True
    for api, other in ((api_a, test), (test_api, live)):
        assert api.get(f"/api/v1/notifications/{other['id']}").status_code == 404
        assert api.post(f"/api/v1/notifications/{other['id']}/cancel").status_code == 404
    # configuration is shared: the test key sees the live key's provider
    assert [p["name"] for p in test_api.get("/api/v1/providers").json()["results"]] == ["mail"]


def test_suppressions_belong_to_one_mode(api_a, test_api):
    made = test_api.post("/api/v1/suppressions", {"channel": "email", "recipient": "jane@example.com"}, format="json")
    assert made.status_code == 201, made.content
    assert api_a.get("/api/v1/suppressions").json()["results"] == []
    assert api_a.get("/api/v1/suppressions", {"recipient": "jane@example.com"}).json()["results"] == []
    assert api_a.get(f"/api/v1/suppressions/{made.json()['id']}").status_code == 404
    assert api_a.delete(f"/api/v1/suppressions/{made.json()['id']}").status_code == 404
    # the same address live is another entry; each mode's sends see their own
    assert api_a.post("/api/v1/suppressions", {"channel": "email", "recipient": "jane@example.com"},
                      format="json").status_code == 201  # fmt: skip
    assert sorted(Suppression.objects.values_list("test", flat=True)) == [False, True]
    assert test_api.delete(f"/api/v1/suppressions/{made.json()['id']}").status_code == 204
    assert Suppression.objects.get().test is False


def test_a_test_suppression_blocks_test_sends_only(tenant_a, api_a, test_api):
    factories.provider(tenant_a, "mail", kind="console", channel="email", is_default=True, config={})
    assert test_api.post("/api/v1/suppressions", {"channel": "email", "recipient": "jane@example.com"},
                         format="json").status_code == 201  # fmt: skip
    assert send(test_api)["status"] == "suppressed"
    assert send(api_a)["status"] == "queued"


def test_workflow_runs_belong_to_the_triggering_keys_mode(api_a, test_api):
    made = test_api.post("/api/v1/workflows", {"key": "welcome", "name": "Welcome", "steps": [SEND]}, format="json")
    assert made.status_code == 201, made.content  # configuration: shared
    assert api_a.get("/api/v1/workflows/welcome").status_code == 200
    assert (
        test_api.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["jane"]}, format="json").status_code == 202
    )
    run = WorkflowRun.objects.get()
    assert run.test is True
    assert api_a.get("/api/v1/workflow-runs").json()["results"] == []
    assert api_a.get(f"/api/v1/workflow-runs/{run.pk}").status_code == 404
    assert [r["id"] for r in test_api.get("/api/v1/workflow-runs").json()["results"]] == [str(run.pk)]
    # a live trigger's run is live, and unseen by the test key
    assert api_a.post("/api/v1/workflows/welcome/trigger", {"subscribers": ["joe"]}, format="json").status_code == 202
    assert [r["subscriber"] for r in test_api.get("/api/v1/workflow-runs").json()["results"]] == ["jane"]


def test_test_keys_are_masked_in_text():
    raw = "op_test_AbCdEfGh_" + "x" * 40
    assert mask_text(f"key {raw} leaked") == "key op_test_AbCdEfGh_**** leaked"


def test_admin_filters_and_badges_test_notifications(tenant_a, api_a, test_api, monkeypatch):
    factories.provider(tenant_a, "mail", kind="console", channel="email", is_default=True, config={})
    live, test = send(api_a), send(test_api)
    monkeypatch.setattr(sys, "stdin", io.StringIO("console-Pa55word-42\n"))
    call_command("create_staff_user", "ops-a", "--tenant", tenant_a.name, "--password-stdin", stdout=io.StringIO())
    staff = Client()
    staff.force_login(get_user_model().objects.get(username="ops-a"))

    def listed(query: str) -> list[str]:
        page = staff.get(f"/admin/notifications/notification/{query}")
        assert page.status_code == 200
        return [str(n.pk) for n in page.context["cl"].result_list]

    assert listed("?mode=test") == [test["id"]]
    assert listed("?mode=live") == [live["id"]]
    assert set(listed("")) == {live["id"], test["id"]}
    html = staff.get("/admin/notifications/notification/").content.decode()
    assert html.count("omnipost-test-badge") == 1
    detail = staff.get(f"/admin/notifications/notification/{test['id']}/change/").content.decode()
    assert "omnipost-test-badge" in detail


def test_an_idempotency_key_never_replays_the_other_modes_response(tenant_a, api_a, test_api):
    factories.provider(tenant_a, "mail", kind="console", channel="email", is_default=True, config={})
    body = {"channel": "email", "recipient": "jane@example.com", "subject": "s", "body": "b"}
    first = test_api.post("/api/v1/notifications", body, format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    assert first.status_code == 201 and first.json()["test"] is True
    replay = test_api.post("/api/v1/notifications", body, format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    assert replay.json()["id"] == first.json()["id"]
    live = api_a.post("/api/v1/notifications", body, format="json", HTTP_IDEMPOTENCY_KEY="order-1")
    assert live.status_code == 422 and first.json()["id"] not in live.content.decode()
    assert Notification.objects.count() == 1


def test_bulk_redrive_takes_its_own_modes_dead_letters(tenant_a):
    from dlq import services as dlq_services
    from dlq.models import DeadLetter

    prov = factories.provider(tenant_a, "hook")
    live, test = factories.notifications(tenant_a, prov, 2, status="failed")
    Notification.objects.filter(pk=test.pk).update(test=True)
    for row, mode in ((live, False), (test, True)):
        DeadLetter.objects.create(tenant=tenant_a, notification=row, provider=prov, failure_class="permanent",
                                  failure_reason="x", attempt_count=1, test=mode)  # fmt: skip
    tenant_a.test_mode = True
    found = dlq_services.matching(dlq_services.RedriveFilters(tenant=tenant_a))
    assert [d.notification_id for d in found] == [test.pk]
    tenant_a.test_mode = None  # the operator's command: every mode
    assert dlq_services.matching(dlq_services.RedriveFilters(tenant=tenant_a)).count() == 2
