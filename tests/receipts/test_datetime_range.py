"""Date-times OmniPost cannot store for every reader are refused with a 400 naming the field, in
vendors' receipts and in the API alike (one range, core.validation.check_datetime_range:
1970-01-01 to 9999-12-30 UTC); a notification whose events were stored out of that range before
still reads (GET notifications/{id} answered 500 for ever: psycopg cannot load year 0)."""

from __future__ import annotations

import importlib
import json
import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test import Client

from core.validation import check_datetime_range, datetime_from_timestamp, parse_aware_datetime
from notifications.models import Notification
from receipts.bounces import _date
from receipts.inbound import Invalid
from receipts.models import NotificationEvent, ReceiptDedup
from receipts.vendors.ses import ses_receipt
from tests.receipts.conftest import SECRET_A, signed
from tests.receipts.test_sendgrid import Signer, event, parse, view
from tests.support.setups import email

pytestmark = pytest.mark.django_db

OUT_OF_RANGE = [
    "0001-01-01T00:00:00+14:00",  # year 0 in UTC: PostgreSQL stores it, psycopg cannot read it back
    "9999-12-31T23:59:59-14:00",  # year 10000 in UTC
    "0001-01-01T00:00:00Z",
    "1969-12-31T23:59:59Z",
    "9999-12-31T00:00:00Z",  # in +14:00 a reader would show year 10000
    "9999-12-31T14:00:00+14:00",
]
IN_RANGE = ["1970-01-01T00:00:00Z", "9999-12-30T23:59:59Z", "1970-01-01T14:00:00+14:00"]


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_the_one_range_check_refuses(value):
    with pytest.raises(ValueError, match="1970-01-01T00:00:00Z and 9999-12-30T23:59:59Z"):
        parse_aware_datetime(value)


@pytest.mark.parametrize("value", ["1970-01-01T14:00:00+14:00", "9999-12-30T23:59:59Z", "2026-05-01T12:00:00-14:00"])
def test_the_one_range_check_accepts(value):
    assert parse_aware_datetime(value).tzinfo == UTC
    assert check_datetime_range(datetime.fromisoformat(value)) == parse_aware_datetime(value)


@pytest.mark.parametrize("stamp", [-1, -62135596800, 253402214400, 10**12, float("nan"), float("inf"), True, "1"])
def test_unix_times_outside_the_range_are_refused(stamp):
    with pytest.raises(ValueError):
        datetime_from_timestamp(stamp)


# --- receipts -------------------------------------------------------------------------------------------


def post(provider_id: int, body: bytes, headers: dict[str, str]):  # noqa: ANN201
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return Client().post(f"/hooks/providers/{provider_id}", body, content_type="application/json", **extra)


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_a_signed_webhook_receipt_out_of_range_is_400_naming_occurred_at(side_a, value):
    note = side_a.notes[0]
    body, headers = signed(SECRET_A, {"type": "bounced", "notification_id": str(note.pk), "occurred_at": value,
                                      "details": {"bounce_type": "hard"}})  # fmt: skip
    response = post(side_a.provider.pk, body, headers)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error" and list(error["details"]) == ["occurred_at"]
    assert "1970-01-01T00:00:00Z" in error["details"]["occurred_at"][0]
    assert not NotificationEvent.objects.exists() and not ReceiptDedup.objects.exists()
    note.refresh_from_db()
    assert note.receipt is None


def test_a_signed_webhook_receipt_at_the_ends_of_the_range_is_applied_and_reads(side_a, api_a):
    for n, value in enumerate(IN_RANGE):
        body, headers = signed(SECRET_A, {"type": "delivered", "notification_id": str(side_a.notes[n].pk),
                                          "occurred_at": value})  # fmt: skip
        assert post(side_a.provider.pk, body, headers).status_code == 200
        detail = api_a.get(f"/api/v1/notifications/{side_a.notes[n].pk}")
        assert detail.status_code == 200 and detail.json()["receipt"] == "delivered"


def test_a_sendgrid_event_out_of_range_is_invalid_naming_its_index():
    signer = Signer()
    nid = str(uuid.uuid4())
    request = signer.request([event("delivered", nid), event("bounce", nid, timestamp=-62135596800)])
    with pytest.raises(Invalid) as refused:
        parse(request, view(signer.public_key))
    assert refused.value.field == "[1].timestamp"
    request = signer.request([event("delivered", nid, timestamp=10**12)])
    with pytest.raises(Invalid, match=r"\[0\]\.timestamp"):
        parse(request, view(signer.public_key))


def test_an_ses_event_out_of_range_is_invalid_naming_the_field():
    message = {"notificationType": "Bounce", "mail": {"messageId": "m-1"},
               "bounce": {"bounceType": "Permanent", "timestamp": "0001-01-01T00:00:00+14:00"}}  # fmt: skip
    with pytest.raises(Invalid) as refused:
        ses_receipt(json.dumps(message), event_id="e-1", sent_at="2026-05-01T12:00:00.000Z")
    assert refused.value.field == "Message.bounce.timestamp"
    del message["bounce"]["timestamp"]  # then the SNS message's own Timestamp is the time
    with pytest.raises(Invalid, match="Timestamp"):
        ses_receipt(json.dumps(message), event_id="e-1", sent_at="9999-12-31T23:59:59-14:00")


def test_a_bounce_mail_date_out_of_range_is_no_date():
    now = datetime(2026, 5, 1, 12, tzinfo=UTC)
    assert _date("Wed, 31 Dec 1969 23:00:00 +0000", now) is None
    assert _date("Fri, 01 May 2026 11:00:00 +0000", now) == datetime(2026, 5, 1, 11, tzinfo=UTC)


def store_event_at(note: Notification, provider_id: int, when: str) -> None:
    """What a hostile receipt left behind before the range check (its partition is the default one)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO notification_events (tenant_id, notification_id, provider_id, type, receipt, occurred_at,"
            " details, created_at) VALUES (%s, %s, %s, 'bounced', 'bounced', %s::timestamptz, '{}', now())",
            [note.tenant_id, note.pk, provider_id, when],
        )


def test_events_stored_out_of_range_before_do_not_break_the_detail(side_a, api_a):
    note = side_a.notes[0]
    store_event_at(note, side_a.provider.pk, "0001-01-01T00:00:00+14:00")
    store_event_at(note, side_a.provider.pk, "12000-01-01T00:00:00Z")
    store_event_at(note, side_a.provider.pk, "2026-05-01T12:00:00Z")
    response = api_a.get(f"/api/v1/notifications/{note.pk}")
    assert response.status_code == 200, response.content
    assert [e["occurred_at"] for e in response.json()["events"]] == [
        "1970-01-01T00:00:00Z", "2026-05-01T12:00:00Z", "9999-12-30T23:59:59.999999Z",
    ]  # fmt: skip
    # The migration moves such rows into the range for every other reader (the admin's event list).
    clamp = importlib.import_module("receipts.migrations.0004_event_times_in_range").CLAMP
    with connection.cursor() as cursor:
        cursor.execute(clamp)
        assert cursor.rowcount == 2
    assert sorted(e.occurred_at.year for e in NotificationEvent.objects.filter(notification=note)) == [1970, 2026, 9999]


# --- the API's date-time fields -------------------------------------------------------------------------


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_api_date_time_fields_refuse_out_of_range_naming_the_field(api_a, setup_a, value):
    def refused(response, field: str) -> bool:  # noqa: ANN001
        return response.status_code == 400 and field in json.dumps(response.json()["error"]["details"])

    assert refused(api_a.post("/api/v1/notifications", email(scheduled_for=value), format="json"), "scheduled_for")
    batch = api_a.post("/api/v1/notifications/batch", {"notifications": [email(scheduled_for=value)]}, format="json")
    assert refused(batch, "scheduled_for")
    assert refused(api_a.get("/api/v1/notifications", {"created_after": value}), "created_after")
    assert refused(api_a.get("/api/v1/notifications", {"created_before": value}), "created_before")
    assert refused(api_a.get("/api/v1/dlq", {"created_after": value}), "created_after")
    assert refused(api_a.post("/api/v1/dlq/redrive", {"created_after": value, "dry_run": True}, format="json"),
                   "created_after")  # fmt: skip
    assert not Notification.objects.exists()
