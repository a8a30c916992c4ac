"""POST/GET notifications, batch, detail with attempts, filters, cursor pagination, query counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.fields import Ciphertext
from notifications.models import DeliveryAttempt, Notification
from queueing import queue
from queueing.models import QueueItem, ScheduledJob
from tests.support.setups import EMAIL, PHONE, TOKEN, email

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications"
BATCH = "/api/v1/notifications/batch"


def post(client, body, url=URL, **headers):  # noqa: ANN001, ANN201
    return client.post(url, body, format="json", **headers)


# --- create ---------------------------------------------------------------------------------------


def test_create_queues_with_defaults_and_masks_the_recipient(api_a, setup_a):
    response = post(api_a, email())
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["status"] == "queued" and data["provider"] == "mail" and data["priority"] == 5
    assert data["queue"] == "default" and data["recipient_masked"] == "j***@example.com"
    assert EMAIL not in response.content.decode()
    row = Notification.objects.get(pk=data["id"])
    assert row.tenant_id == setup_a.tenant.pk and row.recipient == EMAIL
    raw = Notification.objects.filter(pk=row.pk).values_list("recipient", flat=True).get()
    assert isinstance(raw, Ciphertext) and EMAIL not in raw  # stored encrypted
    item = QueueItem.objects.get(notification_id=row.pk)
    assert item.payload_json == {"channel": "email"} and item.provider_id == setup_a.mail.pk
    assert item.priority == 5 and item.queue_name == "default" and item.rate_limited is False


@pytest.mark.parametrize(
    ("body", "masked"),
    [
        ({"channel": "sms", "recipient": PHONE}, "+1******4567"),
        ({"channel": "push", "recipient": TOKEN}, "tok_****9f2c"),
        ({"channel": "webhook", "recipient": "user-42"}, "****"),
    ],
)
def test_each_channel_masks_its_recipient(api_a, setup_a, body, masked):
    response = post(api_a, {**body, "body": "hi"})
    assert response.status_code == 201, response.content
    assert response.json()["recipient_masked"] == masked


def test_future_scheduled_for_creates_a_pending_job_and_no_queue_item(api_a, setup_a):
    when = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    local = when.astimezone(dt_timezone(timedelta(hours=2))).isoformat()
    assert local.endswith("+02:00")
    response = post(api_a, email(scheduled_for=local, priority=9, queue="vip"))
    assert response.status_code == 201, response.content
    data = response.json()
    job = ScheduledJob.objects.get(notification_id=data["id"])
    assert data["status"] == "scheduled" and data["scheduled_job_id"] == str(job.job_id)
    assert job.status == "pending" and job.run_at == when
    assert not QueueItem.objects.filter(notification_id=data["id"]).exists()


def test_past_scheduled_for_is_queued_now(api_a, setup_a):
    response = post(api_a, email(scheduled_for="2001-01-01T00:00:00Z"))
    assert response.status_code == 201 and response.json()["status"] == "queued"
    assert not ScheduledJob.objects.exists()


def test_template_is_rendered_with_the_context(api_a, setup_a):
    response = post(api_a, {"channel": "email", "recipient": EMAIL, "template": "welcome",
                            "context": {"name": "Ada"}})  # fmt: skip
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["subject"], data["body"], data["template"]) == ("Hi Ada", "Welcome, Ada!", "welcome")


def test_named_provider_and_rate_limited_routing(api_a, setup_a):
    setup_a.hook.rate_per_second = 5
    setup_a.hook.save()
    response = post(api_a, {"channel": "webhook", "recipient": "u1", "body": "b", "provider": "hook"})
    assert response.status_code == 201
    assert QueueItem.objects.get(notification_id=response.json()["id"]).rate_limited is True


# --- validation -----------------------------------------------------------------------------------


def error_details(response, status=400) -> dict:  # noqa: ANN001
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == "validation_error"
    return body["error"]["details"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"channel": "email", "recipient": "not-an-email", "body": "b"}, "recipient"),
        ({"channel": "email", "recipient": "a@" + "b" * 10_000 + ".com", "body": "b"}, "recipient"),
        ({"channel": "sms", "recipient": "5551234567", "body": "b"}, "recipient"),
        ({"channel": "sms", "recipient": "+0123", "body": "b"}, "recipient"),
        ({"channel": "sms", "recipient": "+1" + "5" * 10_000, "body": "b"}, "recipient"),
        ({"channel": "push", "recipient": "x" * 10_000, "body": "b"}, "recipient"),
        ({"channel": "push", "recipient": "", "body": "b"}, "recipient"),
        ({"channel": "webhook", "recipient": "ab\ncd", "body": "b"}, "recipient"),
        ({"channel": "webhook", "recipient": "ab\x1bcd", "body": "b"}, "recipient"),
        ({"channel": "webhook", "recipient": 12345, "body": "b"}, "recipient"),
        ({"channel": "fax", "recipient": "x", "body": "b"}, "channel"),
        ({"recipient": EMAIL, "body": "b"}, "channel"),
        (email(priority=10), "priority"),
        (email(priority=-1), "priority"),
        (email(priority=True), "priority"),
        (email(priority="5"), "priority"),
        (email(priority=5.0), "priority"),
        (email(priority=10**30), "priority"),
        (email(scheduled_for="2030-01-01T09:00:00"), "scheduled_for"),
        (email(scheduled_for="2030-01-01"), "scheduled_for"),
        (email(scheduled_for="tomorrow"), "scheduled_for"),
        (email(scheduled_for="0001-01-01T00:00:00+23:59"), "scheduled_for"),
        (email(scheduled_for=1700000000), "scheduled_for"),
        (email(metadata={"k": "v" * 5000}), "metadata"),
        (email(metadata=["not", "an", "object"]), "metadata"),
        (email(queue="no spaces allowed"), "queue"),
        (email(queue="x" * 65), "queue"),
        (email(provider="nope"), "provider"),
        (email(provider="hook"), "provider"),  # a webhook provider for an email
        (email(template="welcome"), "body"),  # template and body together
        ({"channel": "email", "recipient": EMAIL}, "body"),
        ({"channel": "email", "recipient": EMAIL, "body": "b", "context": {"a": 1}}, "context"),
        ({"channel": "email", "recipient": EMAIL, "template": "missing"}, "template"),
        ({"channel": "sms", "recipient": PHONE, "template": "welcome"}, "template"),  # email template
    ],
)
def test_invalid_fields_are_400_naming_the_field_and_store_nothing(api_a, setup_a, body, field):
    details = error_details(post(api_a, body))
    assert field in details and all(isinstance(m, str) for m in details[field])
    assert not Notification.objects.exists() and not QueueItem.objects.exists()


@pytest.mark.parametrize("field", ["status", "tenant", "tenant_id", "attempt_count", "id", "recipient_masked"])
def test_mass_assignment_is_refused(api_a, setup_a, field):
    details = error_details(post(api_a, email(**{field: "delivered"})))
    assert list(details) == [field] and "unknown field" in details[field][0]
    assert not Notification.objects.exists()


def test_missing_default_provider_says_how_to_fix_it(api_a, tenant_a):
    details = error_details(post(api_a, email()))
    assert "is_default" in details["provider"][0]


def test_template_error_at_send_time_is_400(api_a, setup_a):
    setup_a.welcome.body = "{{ n|divisibleby:0 }}"
    setup_a.welcome.save()
    details = error_details(post(api_a, {"channel": "email", "recipient": EMAIL, "template": "welcome",
                                         "context": {"n": 3}}))  # fmt: skip
    assert "ZeroDivisionError" in details["template"][0]


# --- batch ----------------------------------------------------------------------------------------


def test_batch_creates_all_in_order(api_a, setup_a):
    items = [email(subject=f"s{i}", priority=i % 10) for i in range(25)]
    response = post(api_a, {"notifications": items}, BATCH)
    assert response.status_code == 201, response.content
    results = response.json()["results"]
    assert [r["subject"] for r in results] == [f"s{i}" for i in range(25)]
    assert Notification.objects.count() == 25 and QueueItem.objects.count() == 25


def test_batch_is_all_or_nothing_and_names_the_failing_indexes(api_a, setup_a):
    items = [email() for _ in range(10)]
    items[3] = email(recipient="broken")
    items[7] = email(provider="nope", status="sent")
    details = error_details(post(api_a, {"notifications": items}, BATCH))
    assert set(details) == {"notifications"}
    assert set(details["notifications"]) == {"3", "7"}
    assert set(details["notifications"]["3"]) == {"recipient"}
    assert set(details["notifications"]["7"]) == {"status"}  # unknown field, before name resolution
    assert not Notification.objects.exists() and not QueueItem.objects.exists()


@pytest.mark.parametrize(
    "body",
    [{"notifications": []}, {"notifications": "x"}, {"notifications": [{}] * 1001}, [email()], {"items": [email()]}],
)
def test_batch_shape_errors(api_a, setup_a, body):
    assert post(api_a, body, BATCH).status_code == 400
    assert not Notification.objects.exists()


def _count_statements(client, n: int) -> tuple[int, list[str]]:  # noqa: ANN001
    body = {"notifications": [email(priority=i % 10) for i in range(n)]}
    with CaptureQueriesContext(connection) as ctx:
        response = post(client, body, BATCH)
    assert response.status_code == 201, response.content[:500]
    return len(ctx.captured_queries), [q["sql"][:60] for q in ctx.captured_queries]


def test_batch_uses_the_same_statements_for_10_and_1000(api_a, setup_a):
    post(api_a, email())  # the first request of a key also records last_used_at
    small, small_sql = _count_statements(api_a, 10)
    large, large_sql = _count_statements(api_a, 1000)
    assert small == large, (small_sql, large_sql)
    assert large <= 10, large_sql
    assert QueueItem.objects.count() == 1011


def test_create_uses_a_small_fixed_number_of_queries(api_a, setup_a, django_assert_max_num_queries):
    post(api_a, email())
    with django_assert_max_num_queries(8):
        assert post(api_a, email()).status_code == 201
    with django_assert_max_num_queries(9):  # + the template lookup
        body = {"channel": "email", "recipient": EMAIL, "template": "welcome", "context": {"name": "x"}}
        assert post(api_a, body).status_code == 201


# --- hostile input --------------------------------------------------------------------------------


def raw_post(client, raw: bytes, url: str = URL):  # noqa: ANN001, ANN201
    return client.generic("POST", url, raw, "application/json")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"channel": "email", "recipient": "\xff\xfe@example.com", "body": "b"}',
        b'{"channel": "email", "recipient": "a\\u0000b@example.com", "body": "b"}',
        b'{"channel": "email", "recipient": "a@example.com", "body": "b\x00"}',
        b'{"channel": "email", "recipient": "a@example.com", "body": "b", "metadata": ' + b'{"a": ' * 200
        + b"1" + b"}" * 200 + b"}",
        b'{"channel": "email", "recipient": "a@example.com", "body": "b", "priority": ' + b"9" * 5000 + b"}",
        b'{"channel": "email", "recipient": "a@example.com", "body": "b", "priority": 1e999}',
        b'{"channel": "email", "recipient": "a@example.com", "body": "b", "priority": NaN}',
        b'{"channel": "email"',
        b"[" * 100_000,
    ],
)
def test_hostile_bodies_are_clear_400s(api_a, setup_a, raw):
    for url in (URL, BATCH):
        response = raw_post(api_a, raw, url)
        assert response.status_code == 400, response.content
        assert response.json()["error"]["code"] in ("parse_error", "validation_error")
    assert not Notification.objects.exists()


def test_oversized_bodies_are_413(api_a, setup_a, settings):
    settings.OMNIPOST_MAX_REQUEST_BYTES = 2048
    body = {"notifications": [email() for _ in range(40)]}
    response = post(api_a, body, BATCH)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert post(api_a, email(body="x" * 4096)).status_code == 413
    assert not Notification.objects.exists()


def test_wrong_content_type_is_415(api_a, setup_a):
    response = api_a.generic("POST", URL, b"channel=email", "application/x-www-form-urlencoded")
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"


# --- read -----------------------------------------------------------------------------------------


def test_detail_has_attempts_in_the_contract_shape(api_a, setup_a):
    nid = post(api_a, email()).json()["id"]
    started = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    for number, outcome in ((2, "delivered"), (1, "transient_error")):
        DeliveryAttempt.objects.create(
            tenant=setup_a.tenant, notification_id=nid, number=number, provider=setup_a.mail, started_at=started,
            finished_at=started + timedelta(milliseconds=250), outcome=outcome,
            error_class="" if number == 2 else "TimeoutError", error_code="" if number == 2 else "timeout",
            http_status=200 if number == 2 else None, duration_ms=250,
        )  # fmt: skip
    data = api_a.get(f"{URL}/{nid}").json()
    assert data["attempts"] == [
        {"number": 1, "provider": "mail", "started_at": "2030-01-01T12:00:00Z",
         "finished_at": "2030-01-01T12:00:00.250000Z",
         "outcome": "transient_error", "error_class": "TimeoutError", "error_code": "timeout", "http_status": None,
         "duration_ms": 250},
        {"number": 2, "provider": "mail", "started_at": "2030-01-01T12:00:00Z",
         "finished_at": "2030-01-01T12:00:00.250000Z",
         "outcome": "delivered", "error_class": "", "error_code": "", "http_status": 200, "duration_ms": 250},
    ]  # fmt: skip


def test_unknown_and_malformed_ids_are_404(api_a, setup_a):
    assert api_a.get(f"{URL}/00000000-0000-0000-0000-000000000000").status_code == 404
    assert api_a.get(f"{URL}/------------------------------------").status_code == 404
    assert api_a.get(f"{URL}/not-a-uuid").status_code == 404


def test_list_filters(api_a, setup_a):
    post(api_a, email())
    post(api_a, {"channel": "sms", "recipient": PHONE, "body": "b"})
    later = (timezone.now() + timedelta(days=1)).isoformat()
    post(api_a, email(scheduled_for=later))

    def ids(query: str) -> list[str]:
        response = api_a.get(f"{URL}?{query}")
        assert response.status_code == 200, response.content
        return [r["channel"] + ":" + r["status"] for r in response.json()["results"]]

    assert sorted(ids("")) == ["email:queued", "email:scheduled", "sms:queued"]
    assert ids("channel=sms") == ["sms:queued"]
    assert ids("status=scheduled") == ["email:scheduled"]
    assert ids("created_after=2999-01-01T00:00:00Z") == []
    assert len(ids("created_before=2999-01-01T00:00:00%2B01:00")) == 3


def test_a_leased_notification_reads_and_filters_as_dispatching(api_a, setup_a):
    sms = post(api_a, {"channel": "sms", "recipient": PHONE, "body": "b"}).json()
    mail = post(api_a, email()).json()
    QueueItem.objects.filter(notification_id=mail["id"]).update(available_at=timezone.now() + timedelta(hours=1))
    [lease] = queue.claim(1, lease_seconds=30)  # a dispatcher is sending the sms right now
    assert str(lease.notification_id) == sms["id"]

    def ids(query: str) -> list[str]:
        return [r["id"] for r in api_a.get(f"{URL}?{query}").json()["results"]]

    assert api_a.get(f"{URL}/{sms['id']}").json()["status"] == "dispatching"
    assert ids("status=dispatching") == [sms["id"]]
    assert ids("status=queued") == [mail["id"]]
    assert Notification.objects.get(pk=sms["id"]).status == "queued"  # stored as it was
    queue.release([lease])  # the lease ends: queued again
    assert api_a.get(f"{URL}/{sms['id']}").json()["status"] == "queued"
    assert ids("status=dispatching") == []


@pytest.mark.parametrize(
    "query", ["status=sent", "channel=fax", "created_after=yesterday", "created_before=2030-01-01T00:00:00",
              "limit=0", "limit=abc", "limit=100000", "cursor=garbage"],
)  # fmt: skip
def test_bad_filters_are_400(api_a, setup_a, query):
    response = api_a.get(f"{URL}?{query}")
    assert response.status_code == 400, response.content
    assert query.split("=")[0] in response.json()["error"]["details"]


def test_cursor_pagination_walks_every_row_once(api_a, setup_a):
    post(api_a, {"notifications": [email(subject=str(i)) for i in range(7)]}, BATCH)
    seen, url = [], f"{URL}?limit=3"
    while url:
        page = api_a.get(url).json()
        assert set(page) == {"next", "previous", "results"}
        seen += [r["subject"] for r in page["results"]]
        url = page["next"]
    assert sorted(seen) == [str(i) for i in range(7)]
