"""`manage.py prune` empties what other apps register (core.retention): event attempts, finished event
deliveries, the events no pending delivery needs, receipts' de-duplication keys and the providers'
message ids, by age."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from core import retention
from events.emit import emit
from events.models import Event, EventAttempt, EventDelivery
from events.services import create_endpoint
from notifications.models import NotificationDevice, ProviderMessage
from receipts.models import ReceiptDedup
from tests.support.outbox import fan_out

pytestmark = pytest.mark.django_db

OLD = timezone.now() - timedelta(days=40)


def delivered_event(tenant, endpoint, *, old: bool, status: str = "delivered") -> uuid.UUID:  # noqa: ANN001
    """One event with its delivery to `endpoint` (`status`) and one attempt, 40 days old or new."""
    (public_id,) = emit(None, tenant.pk, "recipient.suppressed", [{"recipient_masked": "j***@example.com"}])
    event = Event.objects.get(pk=uuid.UUID(public_id.removeprefix("evt_")))
    fan_out()  # as the event lane does
    delivery = EventDelivery.objects.get(event=event, endpoint=endpoint)
    at = OLD if old else timezone.now()
    EventDelivery.objects.filter(pk=delivery.pk).update(status=status, created_at=at)
    Event.objects.filter(pk=event.pk).update(created_at=at)
    EventAttempt.objects.create(tenant=tenant, event=event, endpoint=endpoint, event_type=event.type,
                                status="delivered" if status == "delivered" else "failed", attempted_at=at)  # fmt: skip
    return event.pk


def test_old_event_history_and_receipt_keys_go_and_what_is_pending_or_new_stays(tenant_a, tenant_b):
    ep_a, _ = create_endpoint(tenant_a, name="ops", url="https://example.com/a", event_types=["*"], actor="test")
    ep_b, _ = create_endpoint(tenant_b, name="ops", url="https://example.com/b", event_types=["*"], actor="test")
    old_done = [delivered_event(tenant_a, ep_a, old=True), delivered_event(tenant_b, ep_b, old=True, status="failed")]
    old_pending = delivered_event(tenant_a, ep_a, old=True, status="pending")  # its endpoint may `recover` it
    new_done = delivered_event(tenant_a, ep_a, old=False)
    # still in the outbox (the lane has not fanned it out): it stays however old
    (unspread,) = emit(None, tenant_a.pk, "recipient.suppressed", [{"recipient_masked": "k***@example.com"}])
    old_unspread = uuid.UUID(unspread.removeprefix("evt_"))
    Event.objects.filter(pk=old_unspread).update(created_at=OLD)
    ReceiptDedup.objects.bulk_create([
        ReceiptDedup(provider_id=1, dedup_key="old-1", created_at=OLD),
        ReceiptDedup(provider_id=2, dedup_key="old-2", created_at=OLD),
        ReceiptDedup(provider_id=1, dedup_key="new", created_at=timezone.now()),
    ])  # fmt: skip
    ProviderMessage.objects.bulk_create([
        ProviderMessage(provider_id=1, message_id="old-1", notification_id=uuid.uuid4(), created_at=OLD),
        ProviderMessage(provider_id=1, message_id="new", notification_id=uuid.uuid4(), created_at=timezone.now()),
    ])  # fmt: skip
    # a push's device results: settled and old go; pending (a push scheduled far ahead) or new stay
    devices = NotificationDevice.objects.bulk_create([
        NotificationDevice(tenant_id=uuid.uuid4(), notification_id=uuid.uuid4(), device_id=uuid.uuid4(), kind="fcm",
                           provider_id=1, status=status) for status in ("delivered", "pending", "delivered")
    ])  # fmt: skip
    NotificationDevice.objects.filter(pk__in=[devices[0].pk, devices[1].pk]).update(updated_at=OLD)
    assert [t.table for t in retention.TABLES] == [
        "provider_messages", "notification_devices", "event_attempts", "event_deliveries", "events",
        "inbox_items", "receipt_dedup", "workflow_runs", "workflow_digests", "workflow_throttles"]  # fmt: skip

    dry = io.StringIO()
    call_command("prune", "--older-than", "30", "--dry-run", stdout=dry)
    assert ("dry run: would delete 1 provider message id(s), 1 push device result(s), 3 event attempt(s), "
            "2 finished event delivery(s), "
            "2 event(s), 0 inbox item(s), 2 receipt de-duplication key(s)") in dry.getvalue()  # fmt: skip
    assert Event.objects.count() == 5 and ReceiptDedup.objects.count() == 3  # a dry run deletes nothing

    out = io.StringIO()
    call_command("prune", "--older-than", "30", "--batch-size", "100", stdout=out, stderr=io.StringIO())
    assert ("deleted 1 provider message id(s), 1 push device result(s), 3 event attempt(s), "
            "2 finished event delivery(s), 2 event(s), 0 inbox item(s), "
            "2 receipt de-duplication key(s), 0 finished workflow run(s), 0 closed digest window(s), "
            "0 throttle window(s);") in out.getvalue()  # fmt: skip
    assert set(Event.objects.values_list("pk", flat=True)) == {old_pending, new_done, old_unspread}
    assert not Event.objects.filter(pk__in=old_done).exists()
    kept = set(EventDelivery.objects.values_list("event_id", "status"))
    assert kept == {(old_pending, "pending"), (new_done, "delivered")}
    # the pending delivery's own old attempt goes (history), the delivery and its event stay
    assert set(EventAttempt.objects.values_list("event_id", flat=True)) == {new_done}
    assert set(ReceiptDedup.objects.values_list("dedup_key", flat=True)) == {"new"}
    assert set(ProviderMessage.objects.values_list("message_id", flat=True)) == {"new"}
    assert set(NotificationDevice.objects.values_list("pk", flat=True)) == {devices[1].pk, devices[2].pk}

    again = io.StringIO()
    call_command("prune", "--older-than", "30", stdout=again, stderr=io.StringIO())
    assert ("deleted 0 provider message id(s), 0 push device result(s), 0 event attempt(s), "
            "0 finished event delivery(s), 0 event(s), 0 inbox item(s), "
            "0 receipt") in again.getvalue()
