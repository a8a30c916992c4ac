"""The receipts statement under its generic plan (as core.hot_sql runs it): a delivered receipt
that takes a promoted fallback out of the queue reads the queue by index, not by a scan of it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core import hot_sql
from notifications.models import Notification
from queueing.models import QueueItem, ScheduledJob
from queueing.scheduler import promote_due
from receipts import providers as provider_views
from receipts.services import apply_receipts
from tests import factories
from tests.receipts.conftest import receipt
from tests.support import plans
from tests.support.setups import PHONE, TOKEN, make_setup

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_delivered_receipt_unqueues_a_promoted_fallback_through_the_queues_indexes(tenant_a, api_a, monkeypatch):
    setup = make_setup(tenant_a)
    subscriber = {"phone": PHONE, "push_tokens": [TOKEN]}
    assert api_a.put("/api/v1/subscribers/u", subscriber, format="json").status_code == 201
    body = {"channel": "push", "subscriber": "u", "body": "b", "fallback": [{"channel": "sms", "after_seconds": 60}]}
    data = api_a.post("/api/v1/notifications", body, format="json").json()
    original, linked = data["id"], data["fallback_notification_id"]
    ScheduledJob.objects.create(tenant_id=tenant_a.pk, notification_id=linked, run_at=timezone.now() - timedelta(1))
    promote_due(100)
    factories.bulk_queued_sql(tenant_a, setup.hook, 20_000)  # a deep queue beside it
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    queued = QueueItem.objects.count()  # the 20,000, the original (no dispatcher runs here) and its fallback

    captured = {}

    def capture(sql, params, using="default"):  # noqa: ANN001, ANN202
        captured.update(sql=sql, params=params)
        return (True, 0, 0, 0, [], 0, False)  # not ok: the statement with the fallback's CTEs follows

    monkeypatch.setattr(hot_sql, "fetchone", capture)
    apply_receipts(provider_views.load(setup.push.pk), [receipt(Notification.objects.get(pk=original), "delivered")])
    monkeypatch.undo()
    connection.ensure_connection()

    def after(cursor):  # noqa: ANN001, ANN202
        cursor.execute("SELECT status FROM notifications WHERE id = %s", [linked])
        status = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM queue_state")
        return status, cursor.fetchone()[0]

    explained = plans.explain_generic(connection.connection, captured["sql"], captured["params"], inside=after)
    assert explained.generic_plans == 1
    assert explained.seen == ("cancelled", queued - 1), "the fallback left the queue, nothing else did"
    scans = plans.scans(explained.plan["Plan"])
    assert not {("Seq Scan", "queue_state"), ("Seq Scan", "notifications")} & scans, scans
    assert QueueItem.objects.filter(notification_id=linked).exists(), "the explain was rolled back"
