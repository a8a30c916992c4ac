"""The test suite's flush (tests.support.fast_flush) leaves what Django's flush leaves."""

from __future__ import annotations

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection

from core.models import AuditEvent, Tenant
from notifications.models import Notification
from tests import factories
from tests.support import fast_flush

pytestmark = pytest.mark.django_db(transaction=True)


def model_tables() -> list[str]:
    return connection.introspection.django_table_names(only_existing=True, include_views=False)


def occupied_tables() -> set[str]:
    with connection.cursor() as cursor:
        return set(fast_flush.occupied(cursor, model_tables())) - fast_flush.KEPT


def fill(tenant: Tenant) -> None:
    prov = factories.provider(tenant)
    factories.queued(tenant, prov, 30)
    AuditEvent.record(actor="test", action="flush.check", tenant=tenant)  # append-only: no DELETE allowed


@pytest.mark.parametrize("threshold", [fast_flush.TRUNCATE_OVER_BYTES, 0], ids=["delete", "truncate"])
def test_flush_empties_every_model_table_whichever_way_it_goes(tenant_a, tenant_b, monkeypatch, threshold):
    fill(tenant_a)
    fill(tenant_b)
    before = occupied_tables()
    assert {"tenants", "notifications", "queue_state", "audit_events"} <= before
    monkeypatch.setattr(fast_flush, "TRUNCATE_OVER_BYTES", threshold)
    kinds = ContentType.objects.count()

    fast_flush.flush("default")

    assert occupied_tables() == set()
    assert Notification.objects.count() == 0 and Tenant.objects.count() == 0
    assert ContentType.objects.count() == kinds  # kept, as post_migrate would have written them again


def test_a_dropped_day_partition_is_back_after_the_flush(tenant_a):
    from core import partitions

    made = partitions.ensure_all()
    assert made == []
    name = sorted(p for p in partitions_of("delivery_attempts") if not p.endswith("_default"))[-1]
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE "{name}"')
    assert name not in partitions_of("delivery_attempts")

    fast_flush.flush("default")

    assert name in partitions_of("delivery_attempts")


def partitions_of(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relid::regclass::text FROM pg_partition_tree(%s::regclass) WHERE isleaf", [table])
        return {row[0] for row in cursor.fetchall()}


def test_the_truncated_set_takes_in_everything_that_references_it():
    references = [("tenants", "notifications"), ("notifications", "queue_state"), ("queue_state", "leases"),
                  ("tenants", "providers")]  # fmt: skip
    big = fast_flush.TRUNCATE_OVER_BYTES + 1
    truncate, delete = fast_flush.plan({"notifications": big, "tenants": 10, "providers": 10, "leases": 10},
                                       references)  # fmt: skip
    assert truncate == {"notifications", "queue_state", "leases"}
    assert delete == {"tenants", "providers"}
    assert fast_flush.plan({"tenants": 10, "auth_permission": 10}, references) == (set(), {"tenants"})
