"""Concurrent applies over the same notifications, in opposite orders: no deadlock, and every
notification ends with the highest-ranked receipt reported, whichever request committed first."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from notifications.models import Notification
from receipts import providers as provider_views
from receipts.models import NotificationEvent
from receipts.services import apply_receipts
from tests import factories
from tests.receipts.conftest import SECRET_A, receipt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_concurrent_applies_converge_on_the_highest_rank(tenant_a):
    prov = factories.provider(tenant_a, "hook", secrets={"signing_secret": SECRET_A})
    notes = factories.notifications(tenant_a, prov, 200, status="delivered")
    view = provider_views.load(prov.pk)
    half = {n.pk for n in notes[::2]}
    batches = [
        [receipt(n, "delivered") for n in notes],
        [receipt(n, "bounced", bounce_type="soft") for n in reversed(notes)],
        [receipt(n, "bounced", bounce_type="hard") for n in notes if n.pk in half],
        [receipt(n, "undelivered") for n in reversed(notes)],
    ]
    start = threading.Barrier(len(batches) * 3)
    errors: list[BaseException] = []

    def worker(batch: list) -> None:
        try:
            start.wait(timeout=10)
            for chunk in range(0, len(batch), 25):  # many small statements, interleaving with the others'
                apply_receipts(view, batch[chunk : chunk + 25])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    # Each batch three times: duplicates racing each other are stored once.
    threads = [threading.Thread(target=worker, args=(b,)) for b in batches for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    shown = dict(Notification.objects.filter(pk__in=[n.pk for n in notes]).values_list("pk", "bounce_type"))
    assert {pk: bt for pk, bt in shown.items()} == {n.pk: ("hard" if n.pk in half else "soft") for n in notes}
    assert set(Notification.objects.filter(pk__in=[n.pk for n in notes]).values_list("receipt", flat=True)) == {
        "bounced"
    }
    assert NotificationEvent.objects.count() == sum(len(b) for b in batches)
