"""The console's `dispatching` filter: a claim changes no indexed column of queue_state (a HOT update),
so the filter finds the leases at the fronts of the claim's orders (queueing.stats.leased_notifications_sql)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from queueing import queue
from tests import factories

pytestmark = pytest.mark.django_db


def listed(client: Client) -> set:
    response = client.get("/admin/notifications/notification/?status=dispatching")
    assert response.status_code == 200
    return {row.pk for row in response.context["cl"].result_list}


def test_the_dispatching_filter_lists_the_leased_notifications_of_every_claim_order(tenant_a, tenant_b):
    hook_a, hook_b = factories.provider(tenant_a, "hook-a"), factories.provider(tenant_b, "hook-b")
    old_low = factories.queued(tenant_a, hook_a, 5, priority=0)  # the oldest: claimed as starving (age front)
    factories.queued(tenant_a, hook_a, 30, priority=9)
    factories.queued(tenant_b, hook_b, 10, queue_name="bulk")
    lane = factories.queued(tenant_b, factories.provider(tenant_b, "limited"), 4, rate_limited=True)
    by_priority = queue.claim(10)  # fair: tenant A's highest and tenant B's
    starving = queue.claim(5, starvation_seconds=0.0)  # every ready item is old: the oldest first
    from_lane = queue.claim(0, lanes={lane[0].provider_id: 2})
    leased = {lease.notification_id for lease in by_priority + starving + from_lane}
    assert {n.id for n in old_low} & leased and len(from_lane) == 2  # a fair share of the oldest
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.test", "x"))
    assert listed(client) == leased
    queue.ack(by_priority)  # acked: no longer dispatching (their notifications' statuses are as they were)
    assert listed(client) == {lease.notification_id for lease in starving + from_lane}
