"""A provider's rate limit is its lane's, in queueing's `lane_limits` (providers.lanes): kept in
sync on every save and delete, with the queued items, and filled from the providers by a migration."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from notifications.models import Notification
from queueing.models import LaneLimit, QueueItem
from tests import factories

pytestmark = pytest.mark.django_db


def limits() -> dict[int, tuple[float, float | None]]:
    return {lane: (rate, burst) for lane, rate, burst in LaneLimit.objects.values_list("lane_id", "rate_per_second",
                                                                                     "burst")}  # fmt: skip


def test_a_providers_limit_follows_every_save_and_delete(tenant_a, django_assert_num_queries):
    free = factories.provider(tenant_a, "free")
    capped = factories.provider(tenant_a, "capped", rate_per_second=5, burst=7)
    assert limits() == {capped.pk: (5.0, 7.0)}
    assert LaneLimit.objects.get().tenant_id == tenant_a.pk
    waiting = factories.queued(tenant_a, free, 2) + factories.queued(tenant_a, capped, 1)
    assert [QueueItem.objects.get(notification_id=n.pk).rate_limited for n in waiting] == [False, False, True]

    free.rate_per_second = 2
    free.save(update_fields=["rate_per_second"])
    capped.rate_per_second = None
    capped.save()
    assert limits() == {free.pk: (2.0, None)}
    assert [QueueItem.objects.get(notification_id=n.pk).rate_limited for n in waiting] == [True, True, False]

    free.name = "renamed"
    with django_assert_num_queries(2):  # its UPDATE and the tenant's config_version: no limit changed
        free.save(update_fields=["name"])

    QueueItem.objects.all().delete()
    Notification.objects.all().delete()  # a provider in use cannot be deleted (PROTECT)
    free.delete()
    capped.delete()
    assert limits() == {}


def test_the_migration_fills_the_lanes_from_the_providers(tenant_a, tenant_b):
    capped = factories.provider(tenant_a, "capped", rate_per_second=5, burst=7)
    other = factories.provider(tenant_b, "other", rate_per_second=0.5)
    factories.provider(tenant_a, "free")
    LaneLimit.objects.all().delete()  # as before the migration
    migration = importlib.import_module("notifications.migrations.0019_lane_limits")
    # The models as they were at that migration (Provider was still notifications'), on today's tables.
    at = MigrationLoader(connection).project_state(("notifications", "0019_lane_limits")).apps
    migration.fill_lane_limits(at, SimpleNamespace(connection=connection))
    assert limits() == {capped.pk: (5.0, 7.0), other.pk: (0.5, None)}
    assert dict(LaneLimit.objects.values_list("lane_id", "tenant_id")) == {capped.pk: tenant_a.pk,
                                                                          other.pk: tenant_b.pk}  # fmt: skip
