"""Bulk sends through the API: every row checked on upload (row and column of each error), start,
cancel, progress, the notifications by row, multipart and JSON uploads, and tenant isolation."""

from __future__ import annotations

import random

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from bulk import engine
from bulk.models import BulkSend, BulkSendChunk
from core.models import AuditEvent
from notifications.models import Notification
from queueing.models import QueueItem, ScheduledJob
from recipients.models import Subscriber

pytestmark = pytest.mark.django_db

URL = "/api/v1/bulk-sends"


def csv_text(rows: int, *, bad: set[int] = frozenset()) -> str:
    """`recipient,name` with `rows` rows; rows in `bad` have a broken address."""
    lines = ["recipient,name"]
    for row in range(1, rows + 1):
        address = f"user{row}.example.com" if row in bad else f"user{row}@example.com"
        lines.append(f"{address},User {row}")
    return "\n".join(lines) + "\n"


def upload(api, text: str, **extra):  # noqa: ANN001, ANN201
    return api.post(URL, {"csv": text, "channel": "email", "template": "welcome", **extra}, format="json")


def run_all() -> int:
    chunks = 0
    while engine.run_chunk().claimed:
        chunks += 1
    return chunks


def test_errors_name_row_and_column_for_each_kind(api_a, setup_a):
    text = ("recipient,name\n"
            "jane@example.com,Jane\n"
            "not-an-address,Bob\n"
            "sam@example.com\n"
            ",Nobody\n"
            "\n"
            "kim@example.com,   \n"
            "lee@example.com,Lee,extra\n")  # fmt: skip
    response = upload(api_a, text)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "invalid" and body["rows"] == 6
    assert [(e["row"], e["column"]) for e in body["errors"]] == [
        (2, "recipient"), (3, "name"), (4, "recipient"), (5, "name"), (6, None)]  # fmt: skip
    assert "email address" in body["errors"][0]["message"]
    assert "missing" in body["errors"][1]["message"]  # a short row misses the variable
    assert not BulkSendChunk.objects.exists()  # an invalid file keeps no rows
    assert api_a.post(f"{URL}/{body['id']}/start").status_code == 409


def test_header_problems_are_400(api_a, setup_a):
    for text, words in [
        ("email,name\na@example.com,A\n", "recipient"),
        ("recipient\na@example.com\n", "name"),
        ("recipient,name,nickname\na@example.com,A,B\n", "unknown columns nickname"),
        ("", "empty"),
        ("recipient,name\n", "no data rows"),
    ]:
        response = upload(api_a, text)
        assert response.status_code == 400, text
        assert words in response.json()["error"]["details"]["file"][0]
    assert not BulkSend.objects.exists()
    response = api_a.post(URL, {"csv": "recipient,name\n", "channel": "sms", "template": "welcome"}, format="json")
    assert response.status_code == 400 and "template" in response.json()["error"]["details"]
    response = api_a.post(URL, {"csv": "recipient,name\n", "channel": "email", "template": "nope"}, format="json")
    assert response.status_code == 400 and "no template" in response.json()["error"]["details"]["template"][0]


def test_37_bad_rows_refused_then_the_fixed_file_completes_once_each(api_a, setup_a):
    bad = set(random.Random(7).sample(range(1, 2001), 37))
    response = upload(api_a, csv_text(2000, bad=bad), name="launch")
    body = response.json()
    assert response.status_code == 201 and body["status"] == "invalid" and body["rows"] == 2000
    assert body["error_count"] == 37 and [e["row"] for e in body["errors"]] == sorted(bad)
    assert {e["column"] for e in body["errors"]} == {"recipient"}

    response = upload(api_a, csv_text(2000), name="launch")
    body = response.json()
    assert body["status"] == "ready" and body["errors"] == [] and body["name"] == "launch"
    assert BulkSendChunk.objects.filter(bulk_send_id=body["id"]).count() == 2
    assert "user1@example.com" not in str(BulkSendChunk.objects.values_list("payload", flat=True).first())
    started = api_a.post(f"{URL}/{body['id']}/start")
    assert started.status_code == 202 and started.json()["status"] == "sending"
    assert api_a.post(f"{URL}/{body['id']}/start").status_code == 409
    assert run_all() == 2
    detail = api_a.get(f"{URL}/{body['id']}").json()
    assert detail["status"] == "completed"
    assert detail["progress"] == {"created": 2000, "delivered": 0, "failed": 0, "suppressed": 0, "pending": 2000}
    rows = list(Notification.objects.filter(bulk_send_id=body["id"]).values_list("bulk_row", flat=True))
    assert sorted(rows) == list(range(1, 2001))
    assert QueueItem.objects.filter(priority=5).count() == 2000  # normal priority: ≥ 7 sends go first
    n = Notification.objects.get(bulk_send_id=body["id"], bulk_row=17)
    assert n.subject == "Hi User 17" and n.recipient == "user17@example.com"
    one = api_a.get(f"/api/v1/notifications/{n.pk}").json()
    assert one["bulk_send_id"] == body["id"] and one["row"] == 17
    page = api_a.get(f"{URL}/{body['id']}/notifications?limit=5").json()
    assert [r["row"] for r in page["results"]] == [1, 2, 3, 4, 5] and page["next"]
    assert api_a.get(page["next"]).json()["results"][0]["row"] == 6
    assert not BulkSendChunk.objects.filter(payload__isnull=False).exists()  # the addresses: in the notifications
    Notification.objects.filter(bulk_send_id=body["id"], bulk_row__lte=10).update(status="delivered")
    Notification.objects.filter(bulk_send_id=body["id"], bulk_row=11).update(status="dead_lettered")
    progress = api_a.get(f"{URL}/{body['id']}").json()["progress"]
    assert progress == {"created": 2000, "delivered": 10, "failed": 1, "suppressed": 0, "pending": 1989}
    # a chunk whose notifications all finished keeps its counts: later reads skip its rows
    Notification.objects.filter(bulk_send_id=body["id"], bulk_row__range=(12, 1000)).update(status="suppressed")
    progress = api_a.get(f"{URL}/{body['id']}").json()["progress"]
    assert progress == {"created": 2000, "delivered": 10, "failed": 1, "suppressed": 989, "pending": 1000}
    first = BulkSendChunk.objects.get(bulk_send_id=body["id"], first_row=1)
    assert first.settled and (first.delivered, first.failed, first.suppressed) == (10, 1, 989)
    assert not BulkSendChunk.objects.get(bulk_send_id=body["id"], first_row=1001).settled
    Notification.objects.filter(bulk_send_id=body["id"], bulk_row__gt=1000).update(status="delivered")
    progress = api_a.get(f"{URL}/{body['id']}").json()["progress"]
    assert progress == {"created": 2000, "delivered": 1010, "failed": 1, "suppressed": 989, "pending": 0}
    assert BulkSend.objects.get(pk=body["id"]).final_counts == {"delivered": 1010, "failed": 1, "suppressed": 989}
    assert api_a.post(f"{URL}/{body['id']}/cancel").status_code == 409


def test_cancel_stops_rows_not_created(api_a, setup_a):
    bulk = upload(api_a, csv_text(2500)).json()
    api_a.post(f"{URL}/{bulk['id']}/start")
    assert engine.run_chunk().claimed == 1
    response = api_a.post(f"{URL}/{bulk['id']}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert response.json()["progress"]["created"] == 1000
    assert run_all() == 0
    assert Notification.objects.filter(bulk_send_id=bulk["id"]).count() == 1000
    assert not ScheduledJob.objects.filter(kind="bulk_send", status="pending").exists()
    assert not BulkSendChunk.objects.filter(payload__isnull=False).exists()
    assert api_a.post(f"{URL}/{bulk['id']}/cancel").status_code == 409
    assert api_a.post(f"{URL}/{bulk['id']}/start").status_code == 409
    assert AuditEvent.objects.filter(action="bulk_send.cancelled", target_id=bulk["id"]).exists()


def test_scheduled_for_waits(api_a, setup_a):
    bulk = upload(api_a, csv_text(3), scheduled_for="2035-01-01T00:00:00Z").json()
    api_a.post(f"{URL}/{bulk['id']}/start")
    assert run_all() == 0
    assert ScheduledJob.objects.get(kind="bulk_send").run_at.year == 2035


def test_multipart_upload(api_a, setup_a):
    data = ("\ufeffrecipient,name\n" + 'a@example.com,"Ann, Jr"\nb@example.com,Bo\n').encode()
    response = api_a.post(URL, {"file": SimpleUploadedFile("list.csv", data, content_type="text/csv"),
                                "channel": "email", "template": "welcome"}, format="multipart")  # fmt: skip
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "ready" and response.json()["rows"] == 2
    api_a.post(f"{URL}/{response.json()['id']}/start")
    run_all()
    assert Notification.objects.get(bulk_row=1).subject == "Hi Ann, Jr"


def test_too_large_and_too_many_rows(api_a, setup_a, settings):
    big = "recipient,name\n" + "a@example.com," + "x" * (20 * 1024 * 1024) + "\n"
    assert upload(api_a, big).status_code == 413
    many = "recipient,name\n" + "a@example.com,A\n" * 100_001
    response = upload(api_a, many)
    assert response.status_code == 400 and "100,000" in response.json()["error"]["details"]["file"][0]


def test_subscribers_unknown_or_without_address_are_errors_opt_outs_are_suppressed(api_a, setup_a, tenant_a):
    Subscriber.objects.create(
        tenant=tenant_a, external_id="u1", email="u1@example.com", email_masked="u***@example.com",
        preferences={"general": {"email": False}},
    )  # fmt: skip
    Subscriber.objects.create(
        tenant=tenant_a, external_id="u2", email="u2@example.com", email_masked="u***@example.com"
    )
    Subscriber.objects.create(tenant=tenant_a, external_id="u3")
    body = upload(api_a, "subscriber,name\nu1,A\nu2,B\nu3,C\nu4,D\n").json()
    assert [(e["row"], e["column"]) for e in body["errors"]] == [(3, "subscriber"), (4, "subscriber")]
    body = upload(api_a, "subscriber,name\nu1,A\nu2,B\n").json()
    assert body["status"] == "ready"
    api_a.post(f"{URL}/{body['id']}/start")
    run_all()
    statuses = dict(Notification.objects.values_list("bulk_row", "status"))
    assert statuses == {1: "suppressed", 2: "queued"}
    assert api_a.get(f"{URL}/{body['id']}").json()["progress"]["suppressed"] == 1


def test_another_tenants_bulk_send_is_404(api_a, api_b, setup_a, setup_b):
    bulk = upload(api_a, csv_text(3)).json()
    for method, path in [("get", ""), ("post", "/start"), ("post", "/cancel"), ("get", "/notifications")]:
        assert getattr(api_b, method)(f"{URL}/{bulk['id']}{path}").status_code == 404
    assert api_b.get(URL).json()["results"] == []
    assert [b["id"] for b in api_a.get(URL).json()["results"]] == [bulk["id"]]
    assert api_a.get(f"{URL}/not-a-uuid").status_code == 404


def test_a_bulk_send_does_not_hold_back_priority_sends_or_other_tenants(api_a, api_b, setup_a, setup_b):
    from queueing import queue

    bulk = upload(api_a, csv_text(2000)).json()
    api_a.post(f"{URL}/{bulk['id']}/start")
    run_all()
    urgent = api_a.post("/api/v1/notifications", {"channel": "email", "recipient": "ops@example.com", "subject": "s",
                                                  "body": "b", "priority": 9}, format="json").json()  # fmt: skip
    other = api_b.post("/api/v1/notifications", {"channel": "email", "recipient": "b@example.com", "subject": "s",
                                                 "body": "b"}, format="json").json()  # fmt: skip
    first = {str(lease.notification_id) for lease in queue.claim(10)}
    assert {urgent["id"], other["id"]} <= first  # in the first claim batch, ahead of 2,000 bulk rows


def test_a_row_refused_once_is_tried_again_and_one_refused_for_good_is_skipped(api_a, setup_a, tenant_a, monkeypatch):
    from notifications import services as creation

    Subscriber.objects.create(
        tenant=tenant_a, external_id="u1", email="u1@example.com", email_masked="u***@example.com"
    )
    Subscriber.objects.create(
        tenant=tenant_a, external_id="u2", email="u2@example.com", email_masked="u***@example.com"
    )
    Subscriber.objects.create(
        tenant=tenant_a, external_id="u3", email="u3@example.com", email_masked="u***@example.com"
    )
    bulk = upload(api_a, "subscriber,name\nu1,A\nu2,B\nu3,C\n").json()
    api_a.post(f"{URL}/{bulk['id']}/start")
    Subscriber.objects.filter(external_id="u3").update(email=None, email_masked="")  # its address gone since
    real, calls = creation.build_specs, []

    def flaky(tenant, drafts, **kwargs):  # noqa: ANN001, ANN003, ANN202 - row 2 misses its render deadline once
        calls.append(len(drafts))
        if len(calls) == 1:
            raise creation.SpecErrors({1: {"template": ["the template takes longer than 0.5 s to render"]}})
        return real(tenant, drafts, **kwargs)

    monkeypatch.setattr(creation, "build_specs", flaky)
    run_all()
    assert sorted(Notification.objects.values_list("bulk_row", flat=True)) == [1, 2]
    body = api_a.get(f"{URL}/{bulk['id']}").json()
    assert body["status"] == "completed" and body["progress"]["created"] == 2 and body["progress"]["failed"] == 1
    assert [(e["row"], e["column"]) for e in body["errors"]] == [(3, "subscriber")]
