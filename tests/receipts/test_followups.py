"""What follows an applied receipt (receipts.followups, an AFTER_APPLY hook): a hard bounce or a
complaint suppresses the address (email and SMS only), and each changed receipt becomes an event for
the tenant's endpoints — `recipient.suppressed` beside it — all in the apply's transaction."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from events.models import Event
from events.services import create_endpoint
from receipts import providers as provider_views
from receipts.services import apply_receipts
from recipients.models import Suppression
from recipients.suppressions import matching
from tests import factories
from tests.receipts.conftest import receipt

pytestmark = pytest.mark.django_db

EMAIL = "Jane.Doe@Example.com"


def channel_side(tenant, channel: str, recipient: str, kind: str = "webhook"):
    prov = factories.provider(tenant, f"p-{channel}", kind=kind, channel=channel, is_default=True)
    notes = factories.notifications(tenant, prov, 2, recipient=recipient, status="delivered")
    return provider_views.load(prov.pk), notes


def events_of(tenant, type_: str) -> list[dict]:
    return [e.payload["data"] for e in Event.objects.for_tenant(tenant).filter(type=type_).order_by("created_at")]


def test_a_hard_bounce_suppresses_the_address_and_tells_the_endpoint(tenant_a):
    create_endpoint(tenant_a, name="ops", url="https://hooks.example.com/ops", event_types=["*"], actor="test")
    view, (bounced, other) = channel_side(tenant_a, "email", EMAIL, kind="console")
    apply_receipts(view, [receipt(bounced, "bounced", bounce_type="hard"), receipt(other, "delivered")])

    [entry] = matching(tenant_a.pk, "jane.doe@example.com", "email")
    assert (entry.reason, entry.category, entry.source_notification_id) == ("hard_bounce", None, bounced.pk)
    [event] = events_of(tenant_a, "notification.bounced")
    assert (event["notification_id"], event["receipt"], event["bounce_type"]) == (str(bounced.pk), "bounced", "hard")
    assert event["recipient_masked"] == bounced.recipient_masked and EMAIL not in str(event)
    [suppressed] = events_of(tenant_a, "recipient.suppressed")
    assert (suppressed["suppression_id"], suppressed["reason"], suppressed["channel"]) == (
        str(entry.pk), "hard_bounce", "email"
    )
    assert suppressed["source_notification_id"] == str(bounced.pk) and EMAIL.lower() not in str(suppressed)
    assert events_of(tenant_a, "notification.delivered") == []  # a delivered receipt makes no event


def test_a_complaint_on_sms_suppresses_a_soft_bounce_does_not(tenant_a):
    view, (complained, soft) = channel_side(tenant_a, "sms", "+14155550123", kind="console")
    apply_receipts(view, [receipt(complained, "complained"), receipt(soft, "bounced", bounce_type="soft")])
    [entry] = Suppression.objects.for_tenant(tenant_a)
    assert (entry.channel, entry.reason, entry.source_notification_id) == ("sms", "complaint", complained.pk)
    assert events_of(tenant_a, "notification.bounced") == []  # no endpoint: no event at all


def test_webhook_addresses_are_never_suppressed_and_undelivered_is_a_failed_event(tenant_a):
    create_endpoint(tenant_a, name="ops", url="https://hooks.example.com/ops",
                    event_types=["notification.failed", "notification.bounced"], actor="test")  # fmt: skip
    view, (bounced, undelivered) = channel_side(tenant_a, "webhook", "https://example.test/hook")
    apply_receipts(view, [receipt(bounced, "bounced", bounce_type="hard"), receipt(undelivered, "undelivered")])
    assert not Suppression.objects.for_tenant(tenant_a).exists()
    [failed] = events_of(tenant_a, "notification.failed")
    assert (failed["notification_id"], failed["status"], failed["receipt"]) == (
        str(undelivered.pk), "delivered", "undelivered"
    )
    assert len(events_of(tenant_a, "notification.bounced")) == 1


def test_the_same_bounce_twice_suppresses_and_tells_once(tenant_a):
    create_endpoint(tenant_a, name="ops", url="https://hooks.example.com/ops", event_types=["*"], actor="test")
    view, (note, _) = channel_side(tenant_a, "email", EMAIL, kind="console")
    twice = receipt(note, "bounced", bounce_type="hard", event_id="evt-1")
    apply_receipts(view, [twice])
    apply_receipts(view, [twice])
    later = receipt(note, "complained", event_id="evt-2")  # a new, higher receipt: one more event, same address
    apply_receipts(view, [later])
    assert len(events_of(tenant_a, "notification.bounced")) == 1
    assert len(events_of(tenant_a, "notification.complained")) == 1
    reasons = sorted(Suppression.objects.for_tenant(tenant_a).values_list("reason", flat=True))
    assert reasons == ["hard_bounce"]  # one entry per address, channel and category: the complaint finds it there
    assert len(events_of(tenant_a, "recipient.suppressed")) == 1


@pytest.mark.parametrize("size", [1, 40])
def test_a_fixed_number_of_statements_whatever_the_batch(tenant_a, size):
    create_endpoint(tenant_a, name="ops", url="https://hooks.example.com/ops", event_types=["*"], actor="test")
    prov = factories.provider(tenant_a, "mail", kind="console", channel="email", is_default=True)
    notes = [factories.notifications(tenant_a, prov, 1, recipient=f"user{i}@example.com", status="delivered")[0]
             for i in range(size)]  # fmt: skip
    view = provider_views.load(prov.pk)
    with CaptureQueriesContext(connection) as ctx:
        apply_receipts(view, [receipt(n, "bounced", bounce_type="hard") for n in notes])
    # apply; read the addresses; insert the entries; recipient.suppressed; notification.bounced
    assert len(ctx.captured_queries) == 5, [q["sql"][:60] for q in ctx.captured_queries]
    assert Suppression.objects.for_tenant(tenant_a).count() == size
    assert len(events_of(tenant_a, "notification.bounced")) == size
    assert len(events_of(tenant_a, "recipient.suppressed")) == size


def test_a_batch_of_delivered_receipts_runs_alone(tenant_a, monkeypatch):
    from receipts import followups

    create_endpoint(tenant_a, name="ops", url="https://hooks.example.com/ops", event_types=["*"], actor="test")
    view, notes = channel_side(tenant_a, "email", EMAIL, kind="console")
    called = []
    monkeypatch.setattr(followups, "suppress_notifications", lambda reasons: called.append(reasons))
    with CaptureQueriesContext(connection) as ctx:
        result = apply_receipts(view, [receipt(n, "delivered") for n in notes])
    assert len(result.changed) == 2 and len(ctx.captured_queries) == 1  # no follow-up, no transaction around it
    assert called == [] and events_of(tenant_a, "notification.bounced") == []
