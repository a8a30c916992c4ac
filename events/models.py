"""Event webhooks to tenants: endpoints, events, their deliveries and attempts.

An `Event` is written once, in the transaction of what caused it (a delivery outcome recorded by
the dispatcher, a receipt, a suppression), marked `fanout_pending` (the outbox). The dispatcher's
event lane (dispatch.events) gives each such event one `EventDelivery` per enabled endpoint
subscribed to its type, in the statement that claims them, and claims due deliveries,
POSTs them signed per Standard Webhooks with `webhook-id` = the event id, and records each try as
an `EventAttempt`. Events carry no recipient in clear: only `recipient_masked`.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.fields import EncryptedTextField
from core.ids import uuid7
from core.models import TenantOwned, TenantQuerySet
from core.models.tenancy import HOT_FK


class EventType(models.TextChoices):
    DELIVERED = "notification.delivered"
    FAILED = "notification.failed"
    DEAD_LETTERED = "notification.dead_lettered"
    BOUNCED = "notification.bounced"
    COMPLAINED = "notification.complained"
    SUPPRESSED = "recipient.suppressed"
    DEVICE_DEACTIVATED = "device.deactivated"
    SEEN = "notification.seen"  # an in_app item first seen by its subscriber (inbox)
    READ = "notification.read"  # an in_app item first read by its subscriber (inbox)


ALL_TYPES = "*"


def public_event_id(value: uuid.UUID) -> str:
    """The id clients see (`webhook-id`, `attempts`): `evt_` + the 32 hex digits of the row's UUID.
    SQL spells it `'evt_' || replace(id::text, '-', '')`."""
    return "evt_" + value.hex


class EventEndpointQuerySet(TenantQuerySet):
    def enabled(self) -> EventEndpointQuerySet:
        return self.filter(enabled=True)


class EventEndpoint(TenantOwned):
    name = models.SlugField(max_length=100)
    url = models.URLField(max_length=2000)
    # As the tenant gave them: a list of EventType values, or ["*"] for every type.
    event_types = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    secret = EncryptedTextField()  # whsec_…; write-only in the API
    # The secret the last rotation replaced, and when: it signs beside the new one for
    # OMNIPOST_SECRET_ROTATION_GRACE_SECONDS (as a webhook provider's previous_secrets).
    previous_secret = EncryptedTextField(null=True, blank=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)
    # Start of the current unbroken run of failed attempts (null after a success).
    failing_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = EventEndpointQuerySet.as_manager()

    class Meta:
        db_table = "event_endpoints"
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="event_endpoint_name_unique_per_tenant"),
        ]

    def __str__(self) -> str:
        return self.name

    def subscribes(self, event_type: str) -> bool:
        return ALL_TYPES in self.event_types or event_type in self.event_types

    def rotation_until(self) -> float | None:
        """Epoch seconds until which the previous secret still signs (None: no grace running)."""
        if not self.previous_secret or self.secret_rotated_at is None:
            return None
        return self.secret_rotated_at.timestamp() + float(settings.OMNIPOST_SECRET_ROTATION_GRACE_SECONDS)


class Event(TenantOwned):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)  # time-ordered; shown as public_id
    tenant = models.ForeignKey("core.Tenant", on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    type = models.CharField(max_length=40, choices=EventType.choices)
    # {"type", "timestamp", "data": {...}}: exactly the body POSTed to the endpoints
    payload = models.JSONField()
    created_at = models.DateTimeField(db_default=models.functions.Now())
    # The outbox flag: written true with the event, in the transaction that caused it; the event
    # lane's claim turns it false as it makes the event's deliveries (one per enabled endpoint
    # subscribed to it), so the statement that records outcomes writes one narrow row per event.
    fanout_pending = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "events"
        indexes = [
            # recover: the tenant's events since a time
            models.Index(fields=["tenant", "created_at"], name="event_tenant_created_idx"),
            # the lane's claim: events not fanned out yet, oldest first
            models.Index(fields=["id"], condition=Q(fanout_pending=True), name="event_fanout_pending_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} {self.type}"

    @property
    def public_id(self) -> str:
        return public_event_id(self.id)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class EventDeliveryQuerySet(TenantQuerySet):
    def pending(self) -> EventDeliveryQuerySet:
        return self.filter(status=DeliveryStatus.PENDING)


class EventDelivery(TenantOwned):
    """One event to one endpoint. Pending ones are the event lane's queue: due at
    `next_attempt_at` (the backoff), claimable unless `locked_until` is still ahead (the lease, the
    visibility timeout: a lane that died leaves a row that becomes claimable again by itself)."""

    tenant = models.ForeignKey("core.Tenant", on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries", db_index=False, **HOT_FK)
    endpoint = models.ForeignKey(
        EventEndpoint, on_delete=models.CASCADE, related_name="deliveries", db_index=False, **HOT_FK
    )  # led by the unique (endpoint, event) index
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=models.functions.Now())
    lock_token = models.UUIDField(null=True, blank=True)
    locked_until = models.DateTimeField(null=True, blank=True)
    last_http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error_code = models.CharField(max_length=100, blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=models.functions.Now())

    objects = EventDeliveryQuerySet.as_manager()

    class Meta:
        db_table = "event_deliveries"
        constraints = [
            # also the index of every lookup by endpoint (recover, disabling, re-enabling)
            models.UniqueConstraint(fields=["endpoint", "event"], name="event_delivery_once_per_endpoint"),
        ]
        indexes = [
            # the lane's claim: pending rows in next_attempt_at order
            models.Index(
                fields=["next_attempt_at", "id"], condition=Q(status="pending"), name="event_delivery_due_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{public_event_id(self.event_id)} → {self.endpoint_id} ({self.status})"


class AttemptStatus(models.TextChoices):
    DELIVERED = "delivered"
    FAILED = "failed"


class EventAttempt(TenantOwned):
    tenant = models.ForeignKey("core.Tenant", on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="attempts", db_index=False, **HOT_FK)
    endpoint = models.ForeignKey(EventEndpoint, on_delete=models.CASCADE, related_name="attempts", db_index=False)
    event_type = models.CharField(max_length=40)
    status = models.CharField(max_length=10, choices=AttemptStatus.choices)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error_code = models.CharField(max_length=100, blank=True, default="")
    duration_ms = models.PositiveIntegerField(default=0)
    attempted_at = models.DateTimeField()

    class Meta:
        db_table = "event_attempts"
        indexes = [
            # GET event-endpoints/{name}/attempts: newest first
            models.Index(fields=["endpoint", "-attempted_at", "-id"], name="event_attempt_recent_idx"),
        ]

    def __str__(self) -> str:
        return f"{public_event_id(self.event_id)} {self.status}"
