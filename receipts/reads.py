"""A notification's receipt events as its API detail shows them (registered with notifications.reads)."""

from __future__ import annotations

from typing import Any

from notifications.models import Notification
from receipts.models import NotificationEvent


def events_of(n: Notification) -> list[dict[str, Any]]:
    """{type, occurred_at, provider (name), details}, oldest first: one statement through
    notif_event_notification_idx."""
    rows = (
        NotificationEvent.objects.filter(notification_id=n.pk, tenant_id=n.tenant_id)
        .order_by("occurred_at", "id")
        .values_list("type", "occurred_at", "provider__name", "details")
    )
    return [
        {"type": kind, "occurred_at": at, "provider": name or "", "details": details or {}}
        for kind, at, name, details in rows
    ]
