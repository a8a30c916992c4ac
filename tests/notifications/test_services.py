"""notifications.services: creation statements and routing, cancelling, the lock-free conditional paths."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.exceptions import NotFound

from core.api.errors import Conflict
from core.models import AuditEvent
from dispatch.delivery import claim_and_start
from notifications import services, statements
from notifications.models import Notification, Status
from notifications.services import NotificationSpec
from notifications.validation import Draft
from providers.models import Provider
from queueing import queue
from queueing.models import QueueItem, ScheduledJob
from templating.models import Template
from tests.support.setups import EMAIL, PHONE

pytestmark = pytest.mark.django_db


def spec(setup, **extra) -> NotificationSpec:  # noqa: ANN001
    return NotificationSpec(channel="email", recipient=EMAIL, provider=setup.mail, body="b", **extra)


def test_create_statements_do_not_depend_on_the_batch_size(setup_a):
    counts = []
    for n in (1, 50, 500):
        specs = [spec(setup_a, priority=i % 10) for i in range(n)]
        specs += [spec(setup_a, scheduled_for=timezone.now() + timedelta(hours=1)) for _ in range(n)]
        with CaptureQueriesContext(connection) as ctx:
            services.create_notifications(setup_a.tenant, specs, actor="test")
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1] == counts[2] <= 8, counts
    assert Notification.objects.count() == 1102
    assert QueueItem.objects.count() == ScheduledJob.objects.count() == 551


def test_queue_payload_carries_routing_data_only(setup_a):
    setup_a.tenant.rate_per_second = 10
    setup_a.tenant.save()
    [n] = services.create_notifications(setup_a.tenant, [spec(setup_a, priority=7, queue="q1")], actor="test")
    row = connection.cursor()
    row.execute("SELECT payload_json::text, priority, queue_name, rate_limited FROM queue_state")
    payload, priority, queue_name, rate_limited = row.fetchone()
    assert EMAIL not in payload and "b" not in payload.replace("channel", "")
    assert (priority, queue_name, rate_limited) == (7, "q1", True)  # the tenant's limit makes it rate limited
    assert n.status == Status.QUEUED and n.enqueued_at is not None


def test_long_masked_recipients_fit_the_column(setup_a):
    long = "a@" + "b" * 63 + "." + ".".join(["c" * 60] * 3) + ".com"
    long_spec = NotificationSpec(channel="email", recipient=long, provider=setup_a.mail, body="b")
    [n] = services.create_notifications(setup_a.tenant, [long_spec], actor="test")
    assert len(Notification.objects.get(pk=n.pk).recipient_masked) <= 200


def test_build_specs_resolves_names_in_four_queries_then_none(setup_a, django_assert_num_queries):
    drafts = [Draft(channel="email", recipient=EMAIL, body="b"), Draft(channel="sms", recipient=PHONE, body="b"),
              Draft(channel="webhook", recipient="u", provider="hook", body="b"),
              Draft(channel="email", recipient=EMAIL, template="welcome", context={"name": "Z"})] * 50  # fmt: skip
    with django_assert_num_queries(4):  # the tenant's config_version, providers, categories, the templates named
        services.build_specs(setup_a.tenant, drafts)
    with django_assert_num_queries(0):  # this process's copy, until the configuration changes
        specs = services.build_specs(setup_a.tenant, drafts)
    with django_assert_num_queries(3):  # uncached: providers, templates and categories (general's quiet hours)
        services.build_specs(setup_a.tenant, drafts, cached=False)
    assert [s.provider.name for s in specs[:4]] == ["mail", "text", "hook", "mail"]
    assert specs[3].body == "Welcome, Z!" and specs[3].template == setup_a.welcome


def test_build_specs_reports_every_bad_index(setup_a):
    drafts = [Draft(channel="email", recipient=EMAIL, body="b"), Draft(channel="email", recipient=EMAIL, provider="x"),
              Draft(channel="push", recipient="t", template="welcome")]  # fmt: skip
    with pytest.raises(services.SpecErrors) as caught:
        services.build_specs(setup_a.tenant, drafts)
    assert set(caught.value.errors) == {1, 2}


def test_other_tenants_providers_and_templates_do_not_resolve(setup_a, setup_b):
    Provider.objects.create(tenant=setup_a.tenant, name="only-a", kind="console", channel="email")
    Template.objects.create(tenant=setup_a.tenant, key="only-a", channel="email", body="x")
    with pytest.raises(services.SpecErrors) as caught:
        services.build_specs(setup_b.tenant, [Draft(channel="email", recipient=EMAIL, provider="only-a", body="b"),
                                              Draft(channel="email", recipient=EMAIL, template="only-a")])
    assert caught.value.errors == {0: {"provider": ["no provider named 'only-a'"]},
                                   1: {"template": ["no template with key 'only-a'"]}}  # fmt: skip
    specs = services.build_specs(setup_b.tenant, [Draft(channel="email", recipient=EMAIL, template="welcome")])
    assert specs[0].provider.tenant_id == setup_b.tenant.pk and specs[0].template.tenant_id == setup_b.tenant.pk


# --- cancel ---------------------------------------------------------------------------------------


def test_cancel_a_queued_notification_deletes_its_idle_item(setup_a):
    [n] = services.create_notifications(setup_a.tenant, [spec(setup_a)], actor="test")
    cancelled = services.cancel_notification(setup_a.tenant, n.pk, actor="api_key:x")
    assert cancelled.status == Status.CANCELLED
    assert not QueueItem.objects.exists()
    event = AuditEvent.objects.get(action="notification.cancelled")
    assert event.target_id == str(n.pk) and event.actor == "api_key:x" and event.tenant_id == setup_a.tenant.pk


def test_cancel_a_scheduled_notification_cancels_its_job(setup_a):
    later = timezone.now() + timedelta(hours=1)
    [n] = services.create_notifications(setup_a.tenant, [spec(setup_a, scheduled_for=later)], actor="test")
    services.cancel_notification(setup_a.tenant, n.pk, actor="test")
    assert ScheduledJob.objects.get(notification_id=n.pk).status == ScheduledJob.Status.CANCELLED


def test_the_dispatcher_skips_a_notification_that_is_no_longer_sendable(setup_a):
    notes = services.create_notifications(setup_a.tenant, [spec(setup_a) for _ in range(3)], actor="test")
    Notification.objects.filter(pk=notes[0].pk).update(status=Status.CANCELLED)
    Notification.objects.filter(pk=notes[1].pk).update(status=Status.DISPATCHING)  # written by an earlier version
    prepared, skipped = claim_and_start(10)
    assert {p.notification_id for p in prepared} == {notes[1].pk, notes[2].pk}
    assert [lease.notification_id for lease in skipped] == [notes[0].pk]  # acked, never sent
    assert Notification.objects.get(pk=notes[2].pk).status == Status.QUEUED  # a claim writes no status


def test_the_dispatchers_claim_holds_each_queue_rows_lease(setup_a):
    """The dispatcher's claim returns fewer columns than queue.claim: its leases still match the
    rows it locked (one token for the claim), in priority order, with every notification field."""
    notes = services.create_notifications(
        setup_a.tenant, [spec(setup_a, priority=p, subject=f"s{p}") for p in (1, 9, 5)], actor="test"
    )
    prepared, skipped = claim_and_start(10)
    assert not skipped
    assert [p.notification_id for p in prepared] == [notes[1].pk, notes[2].pk, notes[0].pk]
    rows = {q.item_id: q for q in QueueItem.objects.all()}
    assert {p.lease.lock_token for p in prepared} == {q.lock_token for q in rows.values()} != {None}
    for p in prepared:
        row = rows[p.lease.item_id]
        assert (row.notification_id, row.tenant_id, row.provider_id) == (p.notification_id, p.tenant_id, p.provider_id)
        assert p.notification_key == str(row.notification_id) and p.tenant_key == str(setup_a.tenant.pk)
        assert not p.lease.rate_limited
        note = Notification.objects.get(pk=p.notification_id)
        assert (p.channel, p.subject, p.body, p.created_at) == (note.channel, note.subject, note.body, note.created_at)
        assert p.recipient() == EMAIL and (p.attempt_number, p.attempts_this_run) == (1, 1)


@pytest.mark.parametrize(
    "metadata",
    [
        {},
        {"order": 12345, "ratio": 0.1, "tags": ["a", "ü ✓"], "nested": {"ok": True, "none": None}},
        {"u64": 2**64 - 1, "i64": -(2**63), "beyond": 2**70, "below": -(2**70), "digits": "1" * 25},
    ],
)
def test_the_claim_reads_metadata_back_exactly(setup_a, metadata):
    """orjson reads the claim's metadata, except integers beyond 64 bits (it would make them floats)."""
    services.create_notifications(setup_a.tenant, [spec(setup_a, metadata=metadata)], actor="test")
    [prepared], _ = claim_and_start(1)
    assert prepared.metadata == metadata
    assert {k: type(v) for k, v in prepared.metadata.items()} == {k: type(v) for k, v in metadata.items()}


def test_cancel_an_expired_lease_deletes_the_item(setup_a):
    [n] = services.create_notifications(setup_a.tenant, [spec(setup_a)], actor="test")
    queue.claim(1, lease_seconds=0.0)
    services.cancel_notification(setup_a.tenant, n.pk, actor="test")
    assert not QueueItem.objects.exists()


@pytest.mark.parametrize("status", ["queued", "retrying"])
def test_cancel_is_409_while_a_dispatcher_holds_the_lease(setup_a, status):
    [n] = services.create_notifications(setup_a.tenant, [spec(setup_a)], actor="test")
    Notification.objects.filter(pk=n.pk).update(status=status)
    [lease] = queue.claim(1, lease_seconds=30)
    with pytest.raises(Conflict, match="dispatching") as caught:
        services.cancel_notification(setup_a.tenant, n.pk, actor="test")
    assert caught.value.get_codes() == "not_cancellable"
    assert Notification.objects.get(pk=n.pk).status == status
    assert QueueItem.objects.get().lock_token == lease.lock_token  # still the dispatcher's
    assert Notification.objects.with_live_status().get(pk=n.pk).live_status == "dispatching"


@pytest.mark.parametrize("status", ["dispatching", "delivered", "failed", "dead_lettered", "cancelled"])
def test_cancel_is_409_outside_cancellable_states(setup_a, status):
    [n] = services.create_notifications(setup_a.tenant, [spec(setup_a)], actor="test")
    Notification.objects.filter(pk=n.pk).update(status=status)
    with pytest.raises(Conflict) as caught:
        services.cancel_notification(setup_a.tenant, n.pk, actor="test")
    assert caught.value.get_codes() == "not_cancellable"
    assert Notification.objects.get(pk=n.pk).status == status
    assert QueueItem.objects.count() == 1  # nothing changed


def test_cancel_with_another_tenant_is_not_found_and_changes_nothing(setup_a, setup_b):
    later = timezone.now() + timedelta(hours=1)
    [n] = services.create_notifications(setup_a.tenant, [spec(setup_a, scheduled_for=later)], actor="test")
    with pytest.raises(NotFound):
        services.cancel_notification(setup_b.tenant, n.pk, actor="test")
    with pytest.raises(NotFound):
        services.cancel_scheduled_job(setup_b.tenant, ScheduledJob.objects.get(notification_id=n.pk).pk, actor="test")
    assert Notification.objects.get(pk=n.pk).status == Status.SCHEDULED
    assert ScheduledJob.objects.get(notification_id=n.pk).status == ScheduledJob.Status.PENDING
    with pytest.raises(NotFound):
        services.cancel_notification(setup_a.tenant, uuid.uuid4(), actor="test")


def test_cancel_scheduled_job(setup_a):
    later = timezone.now() + timedelta(hours=1)
    [n] = services.create_notifications(setup_a.tenant, [spec(setup_a, scheduled_for=later)], actor="test")
    job = ScheduledJob.objects.get(notification_id=n.pk)
    services.cancel_scheduled_job(setup_a.tenant, job.pk, actor="test")
    assert ScheduledJob.objects.get(pk=job.pk).status == "cancelled"
    assert Notification.objects.get(pk=n.pk).status == Status.CANCELLED
    assert AuditEvent.objects.filter(action="scheduled_job.cancelled", target_id=str(job.pk)).exists()
    with pytest.raises(Conflict):
        services.cancel_scheduled_job(setup_a.tenant, job.pk, actor="test")


def test_cancel_scheduled_job_once_executed_is_409(setup_a):
    later = timezone.now() + timedelta(hours=1)
    [n] = services.create_notifications(setup_a.tenant, [spec(setup_a, scheduled_for=later)], actor="test")
    ScheduledJob.objects.filter(notification_id=n.pk).update(status="executed", executed_at=timezone.now())
    Notification.objects.filter(pk=n.pk).update(status=Status.DELIVERED)
    with pytest.raises(Conflict) as caught:
        services.cancel_scheduled_job(setup_a.tenant, ScheduledJob.objects.get(notification_id=n.pk).pk, actor="test")
    assert "executed" in str(caught.value.detail)
    assert Notification.objects.get(pk=n.pk).status == Status.DELIVERED


def test_notification_ids_grow_with_time_so_a_batch_sits_together_in_every_index(setup_a):
    first = services.create_notifications(setup_a.tenant, [spec(setup_a) for _ in range(300)], actor="test")
    second = services.create_notifications(setup_a.tenant, [spec(setup_a)], actor="test")
    ids = [n.id for n in first + second]
    assert all(i.version == 7 for i in ids)
    assert ids == sorted(ids)
    assert Notification(tenant=setup_a.tenant).id.version == 7  # the model's default too


@pytest.mark.parametrize("value", [
    {"order": 1234, "name": "Zoë ✓", "nested": [1, 2.5, None, True, {"k": "\u2028"}]},
    [],
    {"huge": 2**70},  # beyond orjson's 64 bits: the column's encoder writes it
    {"at": timezone.now(), "amount": __import__("decimal").Decimal("1.10")},  # the encoder's formats
    {1: "an int key"},  # json.dumps turns it into "1"
    {"id": uuid.UUID(int=7), "kind": Status.QUEUED},
])  # fmt: skip
def test_json_columns_hold_what_the_columns_encoder_would_write(value):
    import json

    from django.core.serializers.json import DjangoJSONEncoder

    expected = json.loads(json.dumps(value, cls=DjangoJSONEncoder))
    assert json.loads(statements.json_text(value, DjangoJSONEncoder)) == expected


def test_metadata_round_trips_through_the_create_statement(setup_a):
    metadata = {"order": 1234, "name": "Zoë ✓", "huge": 2**70, "list": [1, 2.5, None]}
    spec = NotificationSpec(channel="email", recipient=EMAIL, provider=setup_a.mail, body="b", metadata=metadata)
    [n] = services.create_notifications(setup_a.tenant, [spec], actor="test")
    assert Notification.objects.get(pk=n.pk).metadata == metadata
