"""Receipt events (the history a notification's `events` shows), their de-duplication keys and the
counter of events ignored as unknown or foreign.

`notification_events` is a history table: [7/7] partitions it by day of `occurred_at`, so nothing
here needs a unique index across it. De-duplication lives in `receipt_dedup`, a small table with one
unique key per (provider, vendor event id or hash), which `apply_receipts` fills in the statement
that inserts the events.
"""

from __future__ import annotations

from django.db import models

from core.models import Tenant, TenantOwned
from core.models.tenancy import HOT_FK
from notifications.models import BounceType, Notification, ReceiptStatus
from providers.models import Provider


class NotificationEvent(TenantOwned):
    """One receipt event as a provider reported it (receipt states and others: sent, deferred…)."""

    # Read through the notification only (notif_event_notification_idx), never by tenant or provider:
    # an insert writes two indexes.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    notification = models.ForeignKey(
        Notification, on_delete=models.DO_NOTHING, related_name="receipt_events", db_index=False, **HOT_FK
    )
    provider = models.ForeignKey(Provider, on_delete=models.DO_NOTHING, related_name="+", db_index=False, **HOT_FK)
    type = models.CharField(max_length=40)
    receipt = models.CharField(max_length=12, choices=ReceiptStatus.choices, null=True, blank=True)
    bounce_type = models.CharField(max_length=4, choices=BounceType.choices, null=True, blank=True)
    occurred_at = models.DateTimeField()
    details = models.JSONField(default=dict, blank=True)  # scrubbed by the adapter, masked again on the way in
    created_at = models.DateTimeField()

    class Meta:
        db_table = "notification_events"
        ordering = ["occurred_at", "id"]
        indexes = [
            # A notification's events, oldest first (its API detail and the console's inline).
            models.Index(fields=["notification", "occurred_at"], name="notif_event_notification_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.type} of {self.notification_id} at {self.occurred_at:%Y-%m-%d %H:%M:%S}"


class ReceiptDedup(models.Model):
    """A receipt already applied, by its provider and `Receipt.dedup_key`: the second copy changes nothing."""

    pk = models.CompositePrimaryKey("provider_id", "dedup_key")
    provider_id = models.BigIntegerField()  # not a foreign key: keys are checked, never joined
    dedup_key = models.CharField(max_length=300)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "receipt_dedup"

    def __str__(self) -> str:
        return f"{self.provider_id}:{self.dedup_key}"


class ReceiptCounter(models.Model):
    """Receipts ignored (unknown notification, or another tenant's), by provider, for `/metrics`
    (`omnipost_receipts_ignored_total`). Sharded like `delivery_counters` (`shard` = the writing
    session's pg_backend_pid() % SHARDS) so concurrent web processes do not queue on one row."""

    SHARDS = 16

    pk = models.CompositePrimaryKey("shard", "provider_id", "reason")
    shard = models.SmallIntegerField()
    provider_id = models.BigIntegerField()
    reason = models.CharField(max_length=20)
    count = models.BigIntegerField(default=0)

    class Meta:
        db_table = "receipt_counters"

    def __str__(self) -> str:
        return f"{self.reason}/{self.provider_id}: {self.count}"
