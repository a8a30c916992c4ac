"""Who a tenant's notifications go to, and who they must not reach: categories of notification,
subscribers and the suppression list.

A subscriber is the tenant's user, named by the tenant's own `external_id`; its addresses are stored
encrypted (and masked beside them, for lists that must not decrypt), its `preferences` say which
categories it wants on which channel. Categories are the tenant's kinds of message; a critical one
ignores opt-outs. A suppression is an address the tenant's notifications on one channel must not
reach (recipients.suppressions)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from core.channels import Channel
from core.fields import EncryptedJSONField, EncryptedTextField
from core.ids import uuid7
from core.models import ModeOwnedQuerySet, Tenant, TenantOwned
from core.models.tenancy import HOT_FK

GENERAL = "general"


class Category(TenantOwned):
    key = models.SlugField(max_length=100)
    critical = models.BooleanField(default=False)
    description = models.TextField(blank=True, default="")
    # {"start": "HH:MM", "end": "HH:MM"} or null (inherits general's); used by quiet hours.
    quiet_hours = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "categories"
        ordering = ["key"]
        verbose_name_plural = "categories"
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="category_key_unique_per_tenant")]

    def __str__(self) -> str:
        return f"{self.key}{' (critical)' if self.critical else ''}"


class Subscriber(TenantOwned):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    external_id = models.CharField(max_length=200)
    email = EncryptedTextField(null=True, blank=True)
    email_masked = models.CharField(max_length=200, blank=True, default="")
    phone = EncryptedTextField(null=True, blank=True)
    phone_masked = models.CharField(max_length=40, blank=True, default="")
    push_tokens = EncryptedJSONField(default=list, blank=True)
    push_tokens_masked = models.JSONField(default=list, blank=True)
    timezone = models.CharField(max_length=64, blank=True, default="")
    locale = models.CharField(max_length=35, blank=True, default="", db_default="")  # BCP 47 tag; "" none
    preferences = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "subscribers"
        constraints = [
            # GET/PUT subscribers/{external_id}, notifications by subscriber, the bulk upsert's ON CONFLICT.
            models.UniqueConstraint(fields=["tenant", "external_id"], name="subscriber_external_id_unique"),
        ]
        indexes = [
            # GET subscribers: a tenant's newest first, cursor-paginated on (created_at, id).
            models.Index(fields=["tenant", "-created_at", "-id"], name="subscriber_tenant_recent_idx"),
        ]

    def __str__(self) -> str:
        return self.external_id

    def address_for(self, channel: str) -> str | None:
        """The address a notification on `channel` goes to (push: the first token); None if none."""
        if channel == "email":
            return self.email or None
        if channel == "sms":
            return self.phone or None
        if channel == "push":
            tokens = self.push_tokens or []
            return tokens[0] if tokens else None
        return None  # webhook: no subscriber address

    def opted_out(self, category: str, channel: str) -> bool:
        return (self.preferences or {}).get(category, {}).get(channel) is False


class DeviceKind(models.TextChoices):
    FCM = "fcm", "FCM"
    APNS = "apns", "APNs"
    WEBPUSH = "webpush", "Web Push"


class Device(TenantOwned):
    """One of a subscriber's push destinations: an FCM registration token, an APNs device token or a
    Web Push subscription (its JSON: endpoint and keys). Stored encrypted; `token_masked` is what every
    output shows, `token_index` the keyed blind index of the token (a subscription's endpoint) that
    makes a token one device per tenant (recipients.devices). A device the vendor reported dead is
    `active = false` with its `deactivated_reason`, and is never sent to again."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    subscriber = models.ForeignKey(Subscriber, on_delete=models.CASCADE, related_name="devices", db_index=False)
    kind = models.CharField(max_length=10, choices=DeviceKind.choices)
    token = EncryptedTextField()
    token_masked = models.CharField(max_length=200)
    token_index = models.CharField(max_length=64)
    active = models.BooleanField(default=True)
    deactivated_reason = models.CharField(max_length=100, null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "devices"
        constraints = [
            # One device per token per tenant: registration's upsert (recipients.devices) conflicts on it.
            models.UniqueConstraint(fields=["tenant", "token_index"], name="device_token_unique_per_tenant"),
        ]
        indexes = [
            # GET subscribers/{external_id}/devices, newest first, and a push's devices at creation.
            models.Index(fields=["subscriber", "-created_at", "-id"], name="device_subscriber_recent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.token_masked}{'' if self.active else ' (deactivated)'}"


class SuppressionReason(models.TextChoices):
    HARD_BOUNCE = "hard_bounce"
    COMPLAINT = "complaint"
    UNSUBSCRIBED = "unsubscribed"
    MANUAL = "manual"


class Suppression(TenantOwned):
    """An address a tenant's notifications on one channel must not reach.

    The address is stored encrypted; `recipient_index` is its keyed blind index (`core.crypto.blind_index`
    of the normalised address, `recipients.suppressions.normalise`), which every lookup matches, so the
    table is searched by exact address without decrypting it. `category` null blocks every category on the
    channel; a category blocks that one only (and never a critical category)."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    channel = models.CharField(max_length=10, choices=Channel.choices)
    recipient = EncryptedTextField()
    recipient_masked = models.CharField(max_length=200)
    recipient_index = models.CharField(max_length=64)
    reason = models.CharField(max_length=16, choices=SuppressionReason.choices)
    category = models.CharField(max_length=100, null=True, blank=True)
    source_notification_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    # Test data (created with a test key): seen by test keys only, sent to the simulator.
    test = models.BooleanField(default=False, db_default=False)

    objects = ModeOwnedQuerySet.as_manager()

    class Meta:
        db_table = "suppressions"
        constraints = [
            # One entry per (tenant, channel, address, category); null category is its own value.
            models.UniqueConstraint(
                fields=["tenant", "test", "channel", "recipient_index"], condition=Q(category__isnull=True),
                name="suppression_unique_all_categories",
            ),
            models.UniqueConstraint(
                fields=["tenant", "test", "channel", "recipient_index", "category"],
                condition=Q(category__isnull=False),
                name="suppression_unique_per_category",
            ),
        ]
        indexes = [
            # GET suppressions: a tenant's newest first, cursor-paginated on (created_at, id).
            models.Index(fields=["tenant", "-created_at", "-id"], name="suppression_tenant_recent_idx"),
            # GET suppressions?recipient= (any channel) and the checks at creation and dispatch.
            models.Index(fields=["tenant", "recipient_index"], name="suppression_lookup_idx"),
        ]

    def __str__(self) -> str:
        scope = self.category or "all categories"
        return f"{self.channel} {self.recipient_masked} ({self.reason}, {scope})"


class RevokedUnsubscribeToken(TenantOwned):
    """One unsubscribe token revoked by itself (`recipients.unsubscribe.revoke`): a link that leaked,
    say in a forwarded email, stops working while every other email's link keeps working. Each email's
    token is unique (Fernet's IV and time), so its SHA-256 names it; the token itself is not kept."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    token_digest = models.CharField(max_length=64, unique=True)  # read_token's lookup
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "unsubscribe_token_revocations"

    def __str__(self) -> str:
        return f"revoked unsubscribe token {self.token_digest[:12]}…"


class Topic(TenantOwned):
    """A named group of the tenant's subscribers (recipients.topics): a workflow trigger to it starts
    one run per member. `subscriber_count` is kept by the membership statements' row counts.

    A deleted topic (`deleted_at` set) is gone for the API at once, and its key is free again; its
    memberships are deleted in the background in chunks (a scheduled job standing for `deletion_id`),
    `deleted_through` being the highest membership id deleted so far, then the row itself."""

    key = models.SlugField(max_length=100)
    name = models.CharField(max_length=200, blank=True, default="")
    subscriber_count = models.BigIntegerField(default=0)
    # Fan-outs of this topic not finished yet: while any runs, removed members are kept (marked
    # removed) so each fan-out still reaches everyone who was a member at its trigger.
    active_fanouts = models.IntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    deleted_at = models.DateTimeField(null=True, blank=True)
    deletion_id = models.UUIDField(null=True, blank=True, editable=False)  # its deletion job's opaque id
    deleted_through = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        db_table = "topics"
        ordering = ["-created_at", "-id"]
        constraints = [
            # one live topic per key: a deleted one's key is free while its members are being deleted
            models.UniqueConstraint(fields=["tenant", "key"], condition=Q(deleted_at__isnull=True),
                                    name="topic_key_unique_per_tenant"),
            # the deletion job finds its topic by this id
            models.UniqueConstraint(fields=["deletion_id"], condition=Q(deletion_id__isnull=False),
                                    name="topic_deletion_id_unique"),
        ]  # fmt: skip

    def __str__(self) -> str:
        return self.key


class TopicSubscriber(TenantOwned):
    """One membership. `id` grows with every add and every removal takes the next value of the same
    sequence (`removed_seq`), so a fan-out's boundary (a value of that sequence taken at its trigger)
    tells who was a member then: id <= boundary and (removed_seq is null or removed_seq > boundary)."""

    id = models.BigAutoField(primary_key=True)
    # No constraint and no Django cascade: a topic's members go with it in one DELETE (recipients.topics).
    topic = models.ForeignKey(Topic, on_delete=models.DO_NOTHING, related_name="+", db_index=False,
                              db_constraint=False)  # fmt: skip
    subscriber = models.CharField(max_length=200)  # the external id
    removed_seq = models.BigIntegerField(null=True, blank=True)
    added_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "topic_subscribers"
        constraints = [
            # one live membership per subscriber: the add's ON CONFLICT, the removal's lookup
            models.UniqueConstraint(fields=["topic", "subscriber"], condition=Q(removed_seq__isnull=True),
                                    name="topic_subscriber_live_unique"),
        ]  # fmt: skip
        indexes = [
            # the fan-out's keyset chunks and GET topics/{key}/subscribers: a topic's members in id order
            models.Index(fields=["topic", "id"], name="topic_subscriber_order_idx"),
        ]
