"""The API at the engine's speed: statements per request, counted on PostgreSQL (issue 21).

A warm web process (its key, the tenant's providers/templates and the rate-limit tokens in memory)
creates a notification in one statement of writable CTEs, with or without an Idempotency-Key,
queued or scheduled; its after-commit doorbell goes to the process's ringer thread (queueing.ringer),
not to the request's connection. A detail read is one statement (the notification with its
attempts and its receipt events)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifications import tenant_config
from notifications.models import DeliveryAttempt, IdempotencyRecord, Notification
from providers.models import Provider
from queueing.models import QueueItem, ScheduledJob
from tests.support.setups import email

URL = "/api/v1/notifications"
pytestmark = pytest.mark.django_db


def templated(name: str) -> dict:
    return {"channel": "email", "recipient": "jane.doe@example.com", "template": "welcome", "context": {"name": name}}


def warm(client, setup) -> None:  # noqa: ANN001
    """One request of each kind loads the key, the configuration and a chunk of rate-limit tokens."""
    assert client.post(URL, templated("x"), format="json").status_code == 201
    assert client.post(URL, email(), format="json").status_code == 201


@pytest.fixture
def counted(django_capture_on_commit_callbacks, monkeypatch):  # noqa: ANN001, ANN201
    """Statements of a block on the request's connection, and in `ctx.rings` the doorbells handed
    to the ringer (the after-commit callbacks run as the commit would)."""
    from queueing import ringer

    @contextmanager
    def count() -> Iterator[CaptureQueriesContext]:
        rings: list[tuple[str, str]] = []
        monkeypatch.setattr(ringer, "ring", lambda channel, payload, using="default": rings.append((channel, payload)))
        with CaptureQueriesContext(connection) as ctx, django_capture_on_commit_callbacks(execute=True):
            ctx.rings = rings
            yield ctx
        monkeypatch.undo()

    return count


def statements(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"].split()[0].upper() + " " + q["sql"][:60] for q in ctx.captured_queries]


@pytest.mark.parametrize("idempotency_key", [None, "order-1234"])
@pytest.mark.parametrize("scheduled", [False, True])
def test_a_single_create_is_one_statement_and_its_doorbell_goes_to_the_ringer(
    api_a, setup_a, counted, idempotency_key, scheduled
):
    warm(api_a, setup_a)
    body = templated("Ann")
    if scheduled:
        body["scheduled_for"] = (timezone.now() + timedelta(hours=1)).isoformat()
    headers = {"HTTP_IDEMPOTENCY_KEY": idempotency_key} if idempotency_key else {}
    with counted() as ctx:
        response = api_a.post(URL, body, format="json", **headers)
    assert response.status_code == 201, response.content
    sql = [q["sql"] for q in ctx.captured_queries]
    assert len(sql) <= 3, statements(ctx)
    assert len(sql) == 1, statements(ctx)  # the create statement alone
    assert sql[0].startswith("WITH blocked AS")  # the suppression check folded in
    channel = "omnipost_schedule" if scheduled else "omnipost_queue"
    assert [ring[0] for ring in ctx.rings] == [channel]  # the doorbell, after commit, for the ringer

    data = response.json()
    note = Notification.objects.get(pk=data["id"])
    assert note.body == "Welcome, Ann!" and note.status == ("scheduled" if scheduled else "queued")
    assert QueueItem.objects.filter(notification_id=note.pk).exists() is not scheduled
    job = ScheduledJob.objects.filter(notification_id=note.pk).first()
    assert (job is not None) is scheduled
    if scheduled:
        assert data["scheduled_job_id"] == str(job.pk) and job.status == "pending"
    if idempotency_key:
        record = IdempotencyRecord.objects.get(key=idempotency_key)
        assert record.state == "completed" and record.response_status == 201
        with counted() as ctx:
            replay = api_a.post(URL, body, format="json", **headers)
        assert replay.content == response.content and replay["Idempotent-Replayed"] == "true"
        assert len(ctx.captured_queries) == 2, statements(ctx)  # the statement that finds the key taken, the read
        assert ctx.rings == []


def test_a_batch_is_one_statement_and_its_doorbells(api_a, setup_a, counted):
    warm(api_a, setup_a)
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    items = [email(subject=str(i)) for i in range(20)] + [email(scheduled_for=later) for _ in range(5)]
    with counted() as ctx:
        response = api_a.post(f"{URL}/batch", {"notifications": items}, format="json", HTTP_IDEMPOTENCY_KEY="b-1")
    assert response.status_code == 201
    assert len(ctx.captured_queries) == 1, statements(ctx)  # the statement
    assert sorted(ring[0] for ring in ctx.rings) == ["omnipost_queue", "omnipost_schedule"]  # a doorbell each
    assert QueueItem.objects.count() == 22 and ScheduledJob.objects.count() == 5


def test_a_new_queue_name_is_registered_in_the_same_statement_and_then_costs_nothing(api_a, setup_a, counted):
    warm(api_a, setup_a)
    with counted() as ctx:
        assert api_a.post(URL, email(queue="vip"), format="json").status_code == 201
    assert len(ctx.captured_queries) == 2, statements(ctx)  # the cap check reads the tenant's names once
    with counted() as ctx:
        assert api_a.post(URL, email(queue="vip"), format="json").status_code == 201
    assert len(ctx.captured_queries) == 1, statements(ctx)


def test_a_detail_read_with_attempts_and_events_is_one_statement(api_a, setup_a, counted):
    from receipts.models import NotificationEvent

    warm(api_a, setup_a)
    note_id = api_a.post(URL, email(), format="json").json()["id"]
    now = timezone.now()
    DeliveryAttempt.objects.bulk_create(
        DeliveryAttempt(tenant=setup_a.tenant, notification_id=note_id, number=n, provider=setup_a.mail, started_at=now,
                        finished_at=now, outcome="transient_error", error_code="timeout", duration_ms=5)
        for n in (1, 2, 3)
    )  # fmt: skip
    NotificationEvent.objects.bulk_create(
        NotificationEvent(tenant=setup_a.tenant, notification_id=note_id, provider=setup_a.mail, type=kind,
                          receipt=receipt, occurred_at=now + timedelta(seconds=offset), created_at=now)
        for kind, receipt, offset in (("delivered", "delivered", 2), ("sent", None, 1))
    )  # fmt: skip
    with counted() as ctx:
        response = api_a.get(f"{URL}/{note_id}")
    assert response.status_code == 200
    assert [a["number"] for a in response.json()["attempts"]] == [1, 2, 3]
    assert [(e["type"], e["provider"]) for e in response.json()["events"]] == [("sent", "mail"), ("delivered", "mail")]
    assert len(ctx.captured_queries) == 1, statements(ctx)  # notifications.reads, receipts.reads' LATERAL in it


def test_list_pages_are_a_fixed_number_of_statements(api_a, setup_a, counted):
    warm(api_a, setup_a)
    counts = []
    for _ in range(2):
        api_a.post(f"{URL}/batch", {"notifications": [email()] * 30}, format="json")
        with counted() as ctx:
            page = api_a.get(URL, {"status": "queued"})
        assert page.status_code == 200 and page.json()["results"]
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1] == 1, counts


def test_a_provider_edited_in_another_process_takes_effect_for_the_next_create(api_a, setup_a, counted):
    """Another process's edit bumps the tenant's config_version; this process's stale copy makes the
    create statement store nothing, and the create resolves again against the edited configuration."""
    warm(api_a, setup_a)
    stale = tenant_config.get(setup_a.tenant.pk)
    assert stale is not None and stale.defaults["email"] == setup_a.mail
    other = Provider.objects.create(tenant=setup_a.tenant, name="mail2", kind="console", channel="email")
    Provider.objects.filter(pk=setup_a.mail.pk).update(is_default=False)
    Provider.objects.filter(pk=other.pk).update(is_default=True)
    tenant_config._cache[setup_a.tenant.pk] = stale  # as a process that has not heard of the edit holds it
    response = api_a.post(URL, email(), format="json")
    assert response.status_code == 201 and response.json()["provider"] == "mail2"
    assert Notification.objects.get(pk=response.json()["id"]).provider_id == other.pk
    assert tenant_config.get(setup_a.tenant.pk).version > stale.version


def test_a_provider_deleted_elsewhere_is_refused_not_used(api_a, setup_a, counted):
    warm(api_a, setup_a)
    spare = Provider.objects.create(tenant=setup_a.tenant, name="spare", kind="console", channel="email")
    api_a.post(URL, email(), format="json")
    stale = tenant_config.get(setup_a.tenant.pk)
    assert "spare" in stale.providers
    spare.delete()
    tenant_config._cache[setup_a.tenant.pk] = stale
    response = api_a.post(URL, email(provider="spare"), format="json")
    assert response.status_code == 400 and "provider" in response.json()["error"]["details"]
