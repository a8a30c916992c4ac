"""Small builders for test data (tenants come from conftest fixtures)."""

from __future__ import annotations

import uuid

from benchmarks.seeding import notifications_insert
from core.masking import mask_recipient
from core.models import Tenant
from notifications.models import Notification
from providers.models import Provider
from queueing import queue


def provider(tenant: Tenant, name: str = "hook", *, kind: str = "webhook", channel: str = "webhook",
             config: dict | None = None, secrets: dict | None = None, **extra) -> Provider:
    return Provider.objects.create(
        tenant=tenant, name=name, kind=kind, channel=channel,
        config=config if config is not None else {"url": "http://127.0.0.1:9/hook"},
        secrets=secrets if secrets is not None else {}, **extra,
    )


def notifications(tenant: Tenant, prov: Provider, count: int, *, priority: int = 5, queue_name: str = "default",
                  recipient: str = "https://example.test/hook", status: str = "queued",
                  subject: str = "s", body: str = "b") -> list[Notification]:
    rows = [
        Notification(
            id=uuid.uuid4(), tenant=tenant, channel=prov.channel, provider=prov, recipient=recipient,
            recipient_masked=mask_recipient(prov.channel, recipient), subject=subject, body=body,
            priority=priority, queue=queue_name, status=status,
        )
        for _ in range(count)
    ]
    return Notification.objects.bulk_create(rows, batch_size=2000)


def queued(tenant: Tenant, prov: Provider, count: int, *, priority: int = 5, queue_name: str = "default",
           rate_limited: bool = False, delay: float = 0.0, **fields) -> list[Notification]:
    """Notifications with their live queue items (`fields`: see `notifications`)."""
    rows = notifications(tenant, prov, count, priority=priority, queue_name=queue_name, **fields)
    items = [
        queue.NewItem(notification_id=n.id, tenant_id=tenant.pk, provider_id=prov.pk, queue_name=queue_name,
                      priority=priority, payload={"n": str(n.id)}, delay_seconds=delay)
        for n in rows
    ]
    for start in range(0, len(items), 5000):
        queue.enqueue(items[start:start + 5000])
    if rate_limited:  # the enqueue decides from the limits; a test may want the flag whatever they are
        from queueing.models import QueueItem

        QueueItem.objects.filter(notification_id__in=[n.id for n in rows]).update(rate_limited=True)
    return rows


def bulk_queued_sql(
    tenant: Tenant, prov: Provider, count: int, *, priority: int = 5, queue_name: str = "default"
) -> None:
    """PostgreSQL only: `count` queued notifications with live items in two INSERT … SELECT statements."""
    from django.db import connection

    sample = Notification(tenant=tenant, provider=prov, channel=prov.channel, recipient="https://example.test/h")
    token = Notification._meta.get_field("recipient").get_prep_value(sample.recipient)
    insert, params = notifications_insert(
        tenant.pk, prov.pk, count, channel=prov.channel, recipient=token, recipient_masked="h***", subject="s",
        body="b", priority=priority, queue=queue_name,
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(insert + " RETURNING id", params)
        ids = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            """
            INSERT INTO queue_state (queue_name, priority, payload_json, enqueued_at, available_at, attempts,
                                     tenant_id, notification_id, provider_id, rate_limited)
            SELECT %s, %s, '{}'::jsonb, now(), now(), 0, %s, n, %s, false FROM unnest(%s::uuid[]) AS n
            """,
            [queue_name, priority, tenant.pk, prov.pk, ids],
        )
