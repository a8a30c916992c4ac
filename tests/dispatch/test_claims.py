"""One claim of the dispatcher (dispatch.claims.Claimer.claim) sorts what it leased into its
ClaimResult: to send, suppressed, waiting for an open breaker, failed over into a rate-limited
provider's lane; each item in one list, handed out once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dispatch.claims import ClaimResult
from dispatch.dispatcher import Dispatcher, DispatcherConfig
from notifications.services import NotificationSpec, create_notifications
from recipients import suppressions
from routing.models import ProviderCircuit
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def _create(tenant, provider, recipient: str, *, named: bool = True):  # noqa: ANN001, ANN202
    spec = NotificationSpec(channel="webhook", recipient=recipient, provider=provider, subject="s", body="b",
                            provider_named=named)  # fmt: skip
    [notification] = create_notifications(tenant, [spec], actor="test")
    return notification.id


def _open(provider) -> None:  # noqa: ANN001
    now = timezone.now()
    ProviderCircuit.objects.create(provider=provider, state="open", opened_at=now - timedelta(seconds=1),
                                   probes=0, window_started_at=now, updated_at=now)  # fmt: skip


def test_one_claim_sorts_every_item_into_one_list_of_its_result(tenant_a):
    first = factories.provider(tenant_a, "first", failover_order=0, circuit={"open_seconds": 60})
    factories.provider(tenant_a, "second", failover_order=1, rate_per_second=5, burst=5)
    pinned = factories.provider(tenant_a, "pinned", circuit={"open_seconds": 60})
    fine = factories.provider(tenant_a, "fine")
    sent = _create(tenant_a, fine, "https://example.test/fine")
    blocked = _create(tenant_a, fine, "https://example.test/blocked")
    waits = _create(tenant_a, pinned, "https://example.test/pinned")
    relaned = _create(tenant_a, first, "https://example.test/order", named=False)
    suppressions.suppress(tenant_a.pk, "webhook", "https://example.test/blocked", "manual")
    _open(first)
    _open(pinned)
    claimer = Dispatcher(DispatcherConfig(jitter=False)).claimer

    result = claimer.claim(10)

    assert [p.notification_id for p in result.send] == [sent]
    assert [lease.notification_id for lease in result.suppressed] == [blocked]
    assert [p.notification_id for p in result.waiting] == [waits]  # named, its provider open: it waits
    assert [p.notification_id for p in result.relaned] == [relaned]  # failed over past first, into second's lane
    assert (result.skipped, result.unready) == ([], [])
    assert claimer.claim(10) == ClaimResult()  # all leased, none handed out twice
    assert claimer.claim(0) == ClaimResult()
