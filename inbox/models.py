"""A subscriber's in-app feed: one item per delivered in_app notification, written by the dispatcher's
record statement (inbox.statements), and its seen / read / archived states, changed by the subscriber.

The feed is keyed by (tenant, subscriber external id), as the notification names its subscriber, so a
page is one probe of a partial index led by those columns whatever the table's size."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q

from core.masking import mask_text
from core.models import Tenant, TenantOwned


class InboxItem(TenantOwned):
    id = models.UUIDField(primary_key=True)
    subscriber = models.CharField(max_length=200)
    # The notification it was delivered from (no foreign key: the item outlives the notification's retention).
    notification_id = models.UUIDField(unique=True)
    category = models.CharField(max_length=100, default="general")
    title = models.TextField(blank=True, default="")
    body = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict)
    action_url = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    seen_at = models.DateTimeField(null=True, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    # When it was first read (never cleared by `unread`): a second read is not a second `read` event.
    first_read_at = models.DateTimeField(null=True, blank=True)
    # The item's place in its subscriber's feed, counted up in inbox_counts.last_seq by the statement
    # that writes it: that counts row is locked until the commit, so a subscriber's items commit in
    # `seq` order and "the items after seq N" is exact (the stream's Last-Event-ID, inbox.live).
    seq = models.BigIntegerField(db_default=0)
    # The notification's `ttl_seconds` after the item was written: `manage.py prune` removes it from then on.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "inbox_items"
        indexes = [
            # GET feed (status all, the default): not archived, newest first, cursor on (created_at, id)
            models.Index(fields=["tenant", "subscriber", "-created_at", "-id"], name="inbox_feed_idx",
                         condition=Q(archived_at__isnull=True)),
            # GET feed?status=archived
            models.Index(fields=["tenant", "subscriber", "-created_at", "-id"], name="inbox_archived_idx",
                         condition=Q(archived_at__isnull=False)),
            # GET feed?status=unread, counts' unread, mark-all read
            models.Index(fields=["tenant", "subscriber", "-created_at", "-id"], name="inbox_unread_idx",
                         condition=Q(read_at__isnull=True, archived_at__isnull=True)),
            # GET feed?status=unseen, counts' unseen, mark-all seen
            models.Index(fields=["tenant", "subscriber", "-created_at", "-id"], name="inbox_unseen_idx",
                         condition=Q(seen_at__isnull=True, archived_at__isnull=True)),
            # GET stream: the subscriber's items after the last one a stream sent (or Last-Event-ID)
            models.Index(fields=["tenant", "subscriber", "seq"], name="inbox_stream_idx"),
        ]  # fmt: skip

    def __str__(self) -> str:
        return f"{mask_text(self.title) or self.id} for {self.subscriber}"  # the console's headings: masked


class TokenRevocation(TenantOwned):
    """`POST subscribers/{external_id}/inbox-token/revoke` counts up the subscriber's `generation`; a token
    carries the generation it was issued in and is refused once that is no longer the current one
    (inbox.tokens). No clock is compared, so web processes with skewed clocks agree on what is revoked."""

    subscriber = models.CharField(max_length=200)
    generation = models.PositiveBigIntegerField(default=0)

    class Meta:
        db_table = "inbox_token_revocations"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "subscriber"], name="inbox_revocation_one_per_subscriber")
        ]

    def __str__(self) -> str:
        return f"inbox tokens of {self.subscriber}: generation {self.generation}"


class InboxSettings(models.Model):
    """A tenant's inbox settings (`GET/PATCH settings`): the browser origins /inbox/v1/ answers CORS for."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="+")
    allowed_origins = ArrayField(models.CharField(max_length=300), default=list, blank=True)

    class Meta:
        db_table = "inbox_settings"
        indexes = [
            # a preflight: does any tenant allow this origin (allowed_origins @> ARRAY[origin])
            GinIndex(fields=["allowed_origins"], name="inbox_settings_origins_idx"),
        ]

    def __str__(self) -> str:
        return f"inbox settings of {self.tenant_id}"


class InboxCounts(TenantOwned):
    """A subscriber's counts over its items not archived (`GET counts`), kept by every statement that
    writes the items (inbox.statements), so reading them is one row whatever the feed's size."""

    subscriber = models.CharField(max_length=200)
    unseen = models.BigIntegerField(default=0)
    unread = models.BigIntegerField(default=0)
    total = models.BigIntegerField(default=0)
    # The `seq` of the subscriber's newest item (inbox_items.seq).
    last_seq = models.BigIntegerField(db_default=0)

    class Meta:
        db_table = "inbox_counts"
        constraints = [models.UniqueConstraint(fields=["tenant", "subscriber"], name="inbox_counts_one_per_subscriber")]

    def __str__(self) -> str:
        return f"counts of {self.subscriber}"
