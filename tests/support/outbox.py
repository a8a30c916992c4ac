"""The event outbox in tests: what the event lane's claim does first, on its own."""

from __future__ import annotations

import uuid

from events import deliveries
from events.models import EventDelivery


def fan_out(limit: int = 100_000) -> int:
    """Give every event still marked `fanout_pending` its deliveries, as the lane's claim does
    (events.deliveries), then leave them as a fresh fan-out would be if no lane held them: pending,
    due, unleased, never attempted. Returns how many deliveries were made. (The claim also leases
    due deliveries that already exist: call this before the test's own.)"""
    claimed = deliveries.claim_due(limit, 0, uuid.uuid4())
    ids = [c.delivery_id for c in claimed]
    EventDelivery.objects.filter(id__in=ids).update(lock_token=None, locked_until=None, attempts=0)
    return len(ids)
