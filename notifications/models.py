"""Notifications, their delivery attempts, providers, sequences and idempotency records."""

from __future__ import annotations

from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import Exists, OuterRef, Q

from core.channels import Channel
from core.fields import EncryptedTextField
from core.ids import uuid7
from core.models import ModeOwnedQuerySet, Tenant, TenantOwned
from core.models.tenancy import HOT_FK
from providers.models import Provider
from templating.models import Template


class Status(models.TextChoices):
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    DISPATCHING = "dispatching"
    DELIVERED = "delivered"
    RETRYING = "retrying"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    # Never sent: the recipient is on the tenant's suppression list, or the subscriber opted out of
    # the notification's category on its channel (checked at creation and again at dispatch).
    SUPPRESSED = "suppressed"


CANCELLABLE = (Status.SCHEDULED, Status.QUEUED, Status.RETRYING)
# Stored statuses a dispatcher may claim. While one holds the lease, clients see `dispatching`:
# the lease is the dispatch and is not written to the row (one update per delivery, not two).
# Rows written `dispatching` by earlier versions stay claimable.
LEASABLE = (Status.QUEUED, Status.RETRYING)
FINISHED = (Status.DELIVERED, Status.FAILED, Status.DEAD_LETTERED, Status.CANCELLED, Status.SUPPRESSED)


class ReceiptStatus(models.TextChoices):
    """What a provider reported after it accepted the message; beside `status`."""

    DELIVERED = "delivered"
    UNDELIVERED = "undelivered"
    FAILED = "failed"
    BOUNCED = "bounced"
    COMPLAINED = "complained"


class BounceType(models.TextChoices):
    HARD = "hard"
    SOFT = "soft"


class NotificationQuerySet(ModeOwnedQuerySet):
    def finished(self) -> NotificationQuerySet:
        return self.filter(status__in=FINISHED)

    def with_live_status(self) -> NotificationQuerySet:
        """Annotate `leased` (a live lease on the queue item), which `live_status` reads."""
        from queueing.models import QueueItem

        return self.annotate(leased=Exists(QueueItem.objects.filter(notification_id=OuterRef("pk")).leased()))

    def with_live_status_of(self, status: str) -> NotificationQuerySet:
        """Notifications whose live status (as clients see it) is `status`."""
        qs = self if "leased" in self.query.annotations else self.with_live_status()
        if status == Status.DISPATCHING:
            return qs.filter(Q(status__in=LEASABLE, leased=True) | Q(status=Status.DISPATCHING))
        if status in LEASABLE:
            return qs.filter(status=status, leased=False)
        return qs.filter(status=status)


class Notification(TenantOwned):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)  # time-ordered: see core.ids
    # notif_tenant_recent_idx leads with the tenant, so no separate index on it.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    channel = models.CharField(max_length=10, choices=Channel.choices)
    recipient = EncryptedTextField()
    recipient_masked = models.CharField(max_length=200)
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="notifications", **HOT_FK)
    # The client named the provider: the notification never fails over. False: it came from
    # the channel's failover order (or default) and moves along that order.
    provider_named = models.BooleanField(db_default=True)
    # The template is indexed only where set (a partial index below): most rows have none, and an
    # index they are not in costs their inserts and non-HOT updates nothing.
    template = models.ForeignKey(
        Template, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    # The template's version rendered (the subject and bodies below are that version's), and the tag of
    # the variant used (templating.rendering; null: the template's own fields).
    template_version = models.PositiveIntegerField(null=True, blank=True)
    locale = models.CharField(max_length=35, null=True, blank=True)
    context = models.JSONField(default=dict, blank=True)
    subject = models.TextField(blank=True, default="")
    body = models.TextField(blank=True, default="")
    html_body = models.TextField(blank=True, default="", db_default="")  # email: the HTML part ("" none)
    priority = models.PositiveSmallIntegerField(default=5)
    queue = models.CharField(max_length=100, default="default")
    # The tenant's category key (Category.key); `general` always exists.
    category = models.CharField(max_length=100, default="general", db_default="general")
    # The subscriber's external_id when the notification named one (its address resolved at creation).
    subscriber = models.CharField(max_length=200, null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    scheduled_for = models.DateTimeField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    attempt_count = models.PositiveIntegerField(default=0)
    # Attempts spent before the last redrive; the budget for the current run is max_attempts.
    attempt_offset = models.PositiveIntegerField(default=0)
    last_error_code = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Written by receipts.services.apply_receipts only, by its precedence rule (receipts.precedence).
    receipt = models.CharField(max_length=12, choices=ReceiptStatus.choices, null=True, blank=True)
    bounce_type = models.CharField(max_length=4, choices=BounceType.choices, null=True, blank=True)
    # Channel fallback (notifications.fallback): `fallback` is the chain asked for
    # (`[{"channel", "after_seconds"}]`, at most one step); the linked notification on the next channel is
    # created with this one, `scheduled` without a job until its time is known, and the two point at each
    # other. Written once at creation (never by the record statement), so no index and the rows stay HOT.
    fallback = models.JSONField(null=True, blank=True)
    fallback_notification_id = models.UUIDField(null=True, blank=True)
    fallback_of = models.UUIDField(null=True, blank=True)
    # A push notification's push fields (providers.kinds.push.PUSH_FIELDS), for the native push kinds.
    push = models.JSONField(null=True, blank=True)
    # A bulk send's row (bulk.models.BulkSend: an opaque id here, the app sits above this one): the job
    # and the 1-based data row of its file this notification was created from. Written once at creation;
    # (bulk_send_id, bulk_row) is unique, so a row can never become two notifications.
    bulk_send_id = models.UUIDField(null=True, blank=True)
    bulk_row = models.PositiveIntegerField(null=True, blank=True)
    # Test data (created with a test key): seen by test keys only, sent to the simulator.
    test = models.BooleanField(default=False, db_default=False)

    objects = NotificationQuerySet.as_manager()

    class Meta:
        db_table = "notifications"
        constraints = [
            models.CheckConstraint(condition=Q(priority__gte=0, priority__lte=9), name="notification_priority_0_9"),
            models.CheckConstraint(
                condition=Q(bounce_type__isnull=True) | Q(receipt=ReceiptStatus.BOUNCED),
                name="notification_bounce_type_bounced",
            ),
            # One notification per row of a bulk send, whoever creates it; partial, so rows of no bulk send
            # write nothing to it. Also the bulk send's listing (by row) and its progress counts.
            models.UniqueConstraint(fields=["bulk_send_id", "bulk_row"], condition=Q(bulk_send_id__isnull=False),
                                    name="notification_bulk_row_unique"),
        ]
        indexes = [
            # GET notifications: a tenant's newest first, cursor-paginated on (created_at, id).
            models.Index(fields=["tenant", "-created_at", "-id"], name="notif_tenant_recent_idx"),
            # prune: oldest first. Only never-changing columns are indexed, so the status update that
            # records an outcome can be HOT (heap-only, no index writes; fillfactor 45 leaves room).
            models.Index(fields=["created_at"], name="notif_created_idx"),
            models.Index(fields=["template"], condition=Q(template__isnull=False), name="notif_template_idx"),
            # GET notifications?receipt= (a tenant's, newest first) and the console's receipt filter (every
            # tenant's, newest first). Partial: a row enters them when its first receipt arrives, so the
            # dispatcher's status updates (which never change `receipt`) stay HOT.
            models.Index(fields=["tenant", "receipt", "-created_at", "-id"], condition=Q(receipt__isnull=False),
                         name="notif_tenant_receipt_idx"),
            models.Index(fields=["receipt", "-created_at", "-id"], condition=Q(receipt__isnull=False),
                         name="notif_receipt_idx"),
            # No index names `status` (or any column the record statement updates): one would make every
            # delivery's status update non-HOT and write every index. The console's status filter reads the
            # live tables instead (notifications.admin.StatusFilter).
        ]

    def __str__(self) -> str:
        return f"{self.channel} to {self.recipient_masked} ({self.status})"

    @property
    def live_status(self) -> str:
        """The status clients see: queued or retrying under a live lease reads `dispatching`.
        Needs the `leased` annotation (`with_live_status()`); without it, the stored status."""
        if self.status in LEASABLE and getattr(self, "leased", False):
            return Status.DISPATCHING
        return self.status


class DeviceStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    DEACTIVATED = "deactivated"


class NotificationDevice(models.Model):
    """One device a push notification to a subscriber goes to (recipients' `devices`), and how it went:
    `pending` until the device accepted (`delivered`), refused for good (`failed`) or was found dead
    (`deactivated`); a retry goes to the pending ones only. `provider_id` is the provider serving the
    device's kind: the first of its kind at creation, then the one it went through, or that its next
    try goes through (failover within its kind, routing.failover). Written by the create and by the
    dispatcher's record statement (notifications.statements)."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="device_results", db_index=False, **HOT_FK
    )
    device_id = models.UUIDField()
    kind = models.CharField(max_length=10)
    provider_id = models.BigIntegerField()
    status = models.CharField(max_length=12, choices=DeviceStatus.choices, default=DeviceStatus.PENDING)
    error_code = models.CharField(max_length=100, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "notification_devices"
        constraints = [
            # The detail's list, the claim's pending devices and the record's updates: by notification.
            models.UniqueConstraint(fields=["notification", "device_id"], name="notification_device_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.device_id} ({self.status})"


class AttemptOutcome(models.TextChoices):
    DELIVERED = "delivered"
    TRANSIENT_ERROR = "transient_error"
    PERMANENT_ERROR = "permanent_error"


class DeliveryAttempt(TenantOwned):
    # Read through the notification only: attempt_number_unique covers notification lookups and the
    # tenant and provider need no index of their own. In the database attempt_number_unique is the
    # primary key (migration 0027), and `id`, Django's key, is not indexed: nothing reads an attempt
    # by its id. With the BRIN index below, an insert writes one B-tree entry, not three.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="attempts", db_index=False, **HOT_FK
    )
    number = models.PositiveIntegerField()
    # The provider this try went through (the notification's, or another of its failover order), PROTECTed
    # by the notifications that name it or its order's — providers with attempts are not deleted:
    # a provider that has attempts cannot be deleted. So no index (one less write per delivery),
    # and nothing to do on delete (SET_NULL looked, through the whole table, for rows never there).
    provider = models.ForeignKey(
        Provider, on_delete=models.DO_NOTHING, null=True, blank=True, related_name="+", db_index=False, **HOT_FK
    )
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices)
    error_class = models.CharField(max_length=100, blank=True, default="")
    error_code = models.CharField(max_length=100, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "delivery_attempts"
        ordering = ["notification", "number"]
        constraints = [
            models.UniqueConstraint(fields=["notification", "number"], name="attempt_number_unique"),
        ]
        indexes = [
            # The dashboard's outcomes over the last hour (omnipost_site.ops.figures.throughput). BRIN: attempts
            # arrive in finished_at order, so a block range's min and max pick out the hour; an insert
            # writes nothing to it until its range is summarised (queueing.janitor), where a B-tree
            # wrote an entry per attempt (≈ 70 WAL bytes a delivery).
            BrinIndex(fields=["finished_at"], name="attempt_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.notification_id}: {self.outcome}"


class IdempotencyRecord(TenantOwned):
    class State(models.TextChoices):
        IN_FLIGHT = "in_flight"
        COMPLETED = "completed"

    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=10, choices=State.choices, default=State.IN_FLIGHT)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = EncryptedTextField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "idempotency_records"
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="idempotency_key_unique_per_tenant")]
        indexes = [models.Index(fields=["expires_at"], name="idempotency_expiry_idx")]

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"


class TenantQueue(TenantOwned):
    """A queue name a tenant's notifications use. `OMNIPOST_MAX_QUEUES_PER_TENANT` bounds how many
    each tenant has (`default` is not counted), so queue names, which become index keys, claim
    filters and /metrics labels, cannot grow without bound with tenant input."""

    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "tenant_queues"
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="tenant_queue_unique")]

    def __str__(self) -> str:
        return self.name


from notifications.counters import DeliveryCounter  # noqa: E402, F401 - a model of this app, in its own module


class ProviderMessage(models.Model):
    """The id a provider gave a message it accepted (SES's `MessageId`, SendGrid's `X-Message-Id`), by
    provider: how a receipt that names the message only by that id finds its notification
    (receipts.vendors.ses, receipts.services), and only within the provider that receives it.

    Written by the dispatcher's record statement (notifications.statements.insert_provider_messages_sql)
    for deliveries that returned one; pruned past retention by its created_at (core.retention). No
    foreign keys: a check per row on the dispatcher's hot path, and a notification pruned first just
    leaves a row no receipt finds. The id is the provider's opaque handle, no address or secret."""

    pk = models.CompositePrimaryKey("provider_id", "message_id")
    provider_id = models.BigIntegerField()
    message_id = models.TextField()
    notification_id = models.UUIDField()
    created_at = models.DateTimeField(db_default=models.functions.Now())

    class Meta:
        db_table = "provider_messages"

    def __str__(self) -> str:
        return f"{self.message_id} of provider {self.provider_id}"
