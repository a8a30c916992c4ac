"""Receipts are matched within the provider that sent the notification, not only within its tenant:
one provider's correctly signed callback never changes (or suppresses) what another provider of the
same tenant sent — unless that provider carried one of its attempts (a failover). Others are
acknowledged (the vendor must not retry) and counted as reason="other_provider"."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from notifications.models import DeliveryAttempt, Notification
from receipts.models import NotificationEvent, ReceiptDedup
from receipts.services import apply_receipts, ignored_totals
from recipients.models import Suppression
from tests import factories
from tests.receipts.conftest import SECRET_A, SECRET_B, Side, receipt, signed
from tests.receipts.test_hooks import event, post

pytestmark = pytest.mark.django_db


@pytest.fixture
def other(side_a: Side) -> Side:
    """A second webhook provider of tenant A, with its own secret and its own notifications."""
    prov = factories.provider(side_a.tenant, "hook-2", secrets={"signing_secret": SECRET_B})
    return Side(side_a.tenant, prov, factories.notifications(side_a.tenant, prov, 2, status="delivered"))


def attempt(note: Notification, provider_id: int, number: int = 1) -> None:
    now = timezone.now()
    DeliveryAttempt.objects.create(tenant_id=note.tenant_id, notification=note, number=number,
                                   provider_id=provider_id, started_at=now - timedelta(seconds=1), finished_at=now,
                                   outcome="transient_error")  # fmt: skip


def test_another_providers_signed_receipt_changes_nothing_and_is_counted(side_a, other):
    note = side_a.notes[0]  # sent by side_a's provider
    body, headers = signed(SECRET_B, event(note, "complained"))
    response = post(other.provider.pk, body, headers)
    assert response.status_code == 200 and response.json() == {"received": 1}  # vendors must not retry
    note.refresh_from_db()
    assert (note.receipt, note.bounce_type) == (None, None)
    assert not NotificationEvent.objects.exists() and not ReceiptDedup.objects.exists()
    assert not Suppression.objects.exists()
    assert ignored_totals() == {(other.provider.pk, "other_provider"): 1}

    scrape = Client().get("/metrics").content.decode()
    line = (f'omnipost_receipts_ignored_total{{provider="hook-2",provider_id="{other.provider.pk}",'
            f'reason="other_provider"}} 1.0')  # fmt: skip
    assert line in scrape

    # The provider that sent it is heard, and so is the other one about its own notification.
    body, headers = signed(SECRET_A, event(note, "bounced", details={"bounce_type": "hard"}))
    assert post(side_a.provider.pk, body, headers).json() == {"received": 1}
    body, headers = signed(SECRET_B, event(other.notes[0], "delivered"))
    assert post(other.provider.pk, body, headers).json() == {"received": 1}
    note.refresh_from_db()
    other.notes[0].refresh_from_db()
    assert (note.receipt, note.bounce_type, other.notes[0].receipt) == ("bounced", "hard", "delivered")
    assert ignored_totals() == {(other.provider.pk, "other_provider"): 1}


def test_a_provider_that_carried_an_attempt_after_a_failover_is_heard(side_a, other):
    note = side_a.notes[1]
    attempt(note, side_a.provider.pk, 1)  # failed over from side_a's provider ...
    attempt(note, other.provider.pk, 2)  # ... to hook-2, which accepted it
    body, headers = signed(SECRET_B, event(note, "delivered"))
    assert post(other.provider.pk, body, headers).json() == {"received": 1}
    note.refresh_from_db()
    assert note.receipt == "delivered"
    assert NotificationEvent.objects.get().provider_id == other.provider.pk
    assert ignored_totals() == {}


def test_one_batch_mixes_heard_and_ignored_receipts(side_a, other, side_b):
    result = apply_receipts(other.view, [
        receipt(other.notes[0], "delivered"),  # its own
        receipt(side_a.notes[0], "bounced", bounce_type="hard"),  # the tenant's other provider's
        receipt(side_b.notes[0], "delivered"),  # another tenant's
    ])  # fmt: skip
    assert (result.applied, result.duplicate, result.ignored) == (1, 0, 2)
    assert ignored_totals() == {(other.provider.pk, "other_provider"): 1, (other.provider.pk, "foreign"): 1}
    assert list(Notification.objects.exclude(receipt=None).values_list("pk", flat=True)) == [other.notes[0].pk]
