"""`/api/v1/dlq`: tenant-scoped list and detail, redrive (202), discard (200), bulk redrive, 404s and 409s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.models import AuditEvent
from dlq.models import DeadLetter
from notifications.models import Notification
from queueing.models import QueueItem
from tests import factories
from tests.dlq.test_services import dead_letters

pytestmark = pytest.mark.django_db


@pytest.fixture
def entries_a(tenant_a):  # noqa: ANN001, ANN201
    hook = factories.provider(tenant_a, "hook-a")
    transient = dead_letters(tenant_a, hook, 2, with_attempts=True)
    permanent = dead_letters(tenant_a, factories.provider(tenant_a, "mailer"), 1, status="failed",
                             failure_class="permanent", attempts=1, error_code="http_400")  # fmt: skip
    return transient + permanent


@pytest.fixture
def entry_b(tenant_b):  # noqa: ANN001, ANN201
    return dead_letters(tenant_b, factories.provider(tenant_b, "hook-b"), 1)[0]


def ids(response) -> list[str]:  # noqa: ANN001
    return [row["id"] for row in response.json()["results"]]


def test_list_is_scoped_paginated_and_filtered(api_a, entries_a, entry_b):
    body = api_a.get("/api/v1/dlq").json()
    assert set(body) == {"next", "previous", "results"}
    assert sorted(ids_ := [r["id"] for r in body["results"]]) == sorted(str(e.pk) for e in entries_a)
    assert str(entry_b.pk) not in ids_
    row = next(r for r in body["results"] if r["id"] == str(entries_a[2].pk))
    assert row == {
        "id": str(entries_a[2].pk), "notification_id": str(entries_a[2].notification_id), "provider": "mailer",
        "failure_class": "permanent", "failure_reason": "http_400: Service Unavailable", "error_code": "http_400",
        "last_status_code": 503, "attempt_count": 1, "status": "open", "created_at": row["created_at"],
        "resolved_at": None, "resolved_by": "",
    }  # fmt: skip
    assert ids(api_a.get("/api/v1/dlq?failure_class=permanent")) == [str(entries_a[2].pk)]
    assert len(ids(api_a.get("/api/v1/dlq?provider=hook-a"))) == 2
    assert ids(api_a.get("/api/v1/dlq?status=discarded")) == []
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert ids(api_a.get("/api/v1/dlq", {"created_after": future})) == []
    page = api_a.get("/api/v1/dlq?limit=2").json()
    assert len(page["results"]) == 2 and page["next"]
    rest = api_a.get(page["next"]).json()
    assert len(rest["results"]) == 1 and rest["next"] is None


@pytest.mark.parametrize(
    ("query", "field"),
    [("failure_class=fatal", "failure_class"), ("status=closed", "status"), ("provider=a%20b", "provider"),
     ("created_after=2030-01-01T00:00:00", "created_after"), ("limit=0", "limit")],
)  # fmt: skip
def test_bad_filters_are_400_with_the_field_named(api_a, query, field):
    response = api_a.get(f"/api/v1/dlq?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "validation_error"
    assert field in response.json()["error"]["details"]


def test_detail_has_attempts_and_masked_recipient_only(api_a, entries_a):
    entry = entries_a[0]
    Notification.objects.filter(pk=entry.notification_id).update(recipient_masked="j***@example.com")
    body = api_a.get(f"/api/v1/dlq/{entry.pk}").json()
    assert body["recipient_masked"] == "j***@example.com" and "recipient" not in body
    assert body["notification_status"] == "dead_lettered" and body["channel"] == "webhook"
    assert [a["number"] for a in body["attempts"]] == [1, 2, 3]
    assert set(body["attempts"][0]) == {"number", "provider", "started_at", "finished_at", "outcome", "error_class",
                                        "error_code", "http_status", "duration_ms"}  # fmt: skip
    assert body["attempts"][0]["http_status"] == 503 and body["attempts"][0]["outcome"] == "transient_error"
    assert "example.test" not in str(body)  # the clear recipient (https://example.test/hook) never appears


def test_redrive_is_202_with_the_entry_and_requeues(api_a, entries_a, key_a):
    entry = entries_a[0]
    response = api_a.post(f"/api/v1/dlq/{entry.pk}/redrive")
    assert response.status_code == 202
    body = response.json()
    assert body["id"] == str(entry.pk) and body["status"] == "redriven" and body["notification_status"] == "queued"
    assert body["resolved_by"] == f"api_key:{key_a[3:11]}" and body["resolved_at"]
    assert QueueItem.objects.filter(notification_id=entry.notification_id).count() == 1
    assert AuditEvent.objects.filter(action="dead_letter.redriven", target_id=str(entry.pk)).count() == 1
    again = api_a.post(f"/api/v1/dlq/{entry.pk}/redrive")
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_open"
    assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == 1


def test_redrive_of_a_delivered_notification_is_409_already_delivered(api_a, entries_a):
    entry = entries_a[0]
    Notification.objects.filter(pk=entry.notification_id).update(status="delivered")
    response = api_a.post(f"/api/v1/dlq/{entry.pk}/redrive")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "already_delivered" and "never sent again" in error["message"]
    assert not QueueItem.objects.exists()
    assert DeadLetter.objects.get(pk=entry.pk).status == "open"


def test_discard_is_200_with_the_entry_then_409(api_a, entries_a):
    entry = entries_a[1]
    response = api_a.post(f"/api/v1/dlq/{entry.pk}/discard")
    assert response.status_code == 200 and response.json()["status"] == "discarded"
    assert not QueueItem.objects.exists()
    assert AuditEvent.objects.filter(action="dead_letter.discarded", target_id=str(entry.pk)).count() == 1
    for verb in ("discard", "redrive"):
        conflict = api_a.post(f"/api/v1/dlq/{entry.pk}/{verb}")
        assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "not_open"


def test_another_tenants_entry_is_404_everywhere(api_a, entry_b):
    for method, url in (("get", f"/api/v1/dlq/{entry_b.pk}"), ("post", f"/api/v1/dlq/{entry_b.pk}/redrive"),
                        ("post", f"/api/v1/dlq/{entry_b.pk}/discard")):  # fmt: skip
        response = getattr(api_a, method)(url)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert DeadLetter.objects.get(pk=entry_b.pk).status == "open"
    assert not QueueItem.objects.exists() and not AuditEvent.objects.filter(action__startswith="dead_letter").exists()
    assert api_a.get("/api/v1/dlq/not-a-uuid").status_code == 404


def test_unauthenticated_is_401(anonymous, entry_b):
    assert anonymous.get("/api/v1/dlq").status_code == 401
    assert anonymous.post(f"/api/v1/dlq/{entry_b.pk}/redrive").status_code == 401


def test_bulk_redrive_with_filters_limit_and_dry_run(api_a, entries_a, entry_b):
    dry = api_a.post("/api/v1/dlq/redrive", {"failure_class": "transient", "dry_run": True}, format="json")
    assert dry.status_code == 200 and dry.json() == {"redriven": 0, "would_redrive": 2, "refused": 0, "dry_run": True}
    assert not QueueItem.objects.exists()
    limited = api_a.post("/api/v1/dlq/redrive", {"provider": "hook-a", "limit": 1}, format="json")
    assert limited.json() == {"redriven": 1, "refused": 0, "dry_run": False}
    everything = api_a.post("/api/v1/dlq/redrive", {}, format="json")
    assert everything.json()["redriven"] == 2
    assert DeadLetter.objects.filter(tenant=entries_a[0].tenant, status="open").count() == 0
    assert DeadLetter.objects.get(pk=entry_b.pk).status == "open"  # another tenant's entry never matches
    assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == 3


def test_bulk_redrive_with_a_rate_spreads_the_items(api_a, entries_a):
    response = api_a.post("/api/v1/dlq/redrive", {"rate": 1.0}, format="json")
    assert response.json()["redriven"] == 3
    spread = sorted(QueueItem.objects.values_list("available_at", flat=True))
    assert (spread[-1] - spread[0]).total_seconds() == pytest.approx(2.0, abs=0.2)


@pytest.mark.parametrize(
    ("body", "field"),
    [({"limit": 0}, "limit"), ({"limit": 10_001}, "limit"), ({"rate": 0}, "rate"), ({"status": "open"}, "status"),
     ({"created_after": "yesterday"}, "created_after"), ({"failure_class": "bad"}, "failure_class"),
     ({"dry_run": "maybe"}, "dry_run")],
)  # fmt: skip
def test_bulk_redrive_validates_its_body(api_a, body, field):
    response = api_a.post("/api/v1/dlq/redrive", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["details"]


def test_schema_documents_the_dlq_routes(anonymous):
    schema = anonymous.get("/api/schema/?format=json").json()
    paths = schema["paths"]
    assert {"/api/v1/dlq", "/api/v1/dlq/{id}", "/api/v1/dlq/{id}/redrive", "/api/v1/dlq/{id}/discard",
            "/api/v1/dlq/redrive"} <= set(paths)  # fmt: skip
    assert set(paths["/api/v1/dlq/{id}/redrive"]["post"]["responses"]) >= {"202", "404", "409"}
    assert set(paths["/api/v1/dlq/redrive"]["post"]["responses"]) >= {"200", "400"}
