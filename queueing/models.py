"""The durable queue (`queue_state`), scheduled jobs, worker heartbeats and shared rate buckets.

Queue operations live in `queueing/queue.py`; this module holds the tables and the small
per-row/per-set questions about them.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from core.models import TenantOwned, TenantQuerySet

# A dispatcher holds the item: leased, and the lease has not run out (by the database's clock).
LEASED = Q(lock_token__isnull=False, locked_until__gt=Now())
# The predicate of the main claim's partial indexes. Those for claims over all queues also say
# `priority >= 0`, always true (queue_state_priority_0_9): a claim for named queues does not say it,
# so the planner can never read them for one (their order puts every other queue's items in front).
_READY_UNLIMITED = Q(ready=True, rate_limited=False)
_READY_UNLIMITED_ANY_QUEUE = Q(ready=True, rate_limited=False, priority__gte=0)
# The per-tenant indexes over all queues: `priority <= 9` (always true) is said only by the claims over all
# queues (queue._ALL_QUEUES), so a claim for named queues never reads them.
_READY_UNLIMITED_ALL_QUEUES = Q(ready=True, rate_limited=False, priority__lte=9)


class QueueItemQuerySet(TenantQuerySet):
    def ready(self) -> QueueItemQuerySet:
        return self.filter(available_at__lte=Now())

    def leased(self) -> QueueItemQuerySet:
        return self.filter(LEASED)


class QueueItem(TenantOwned):
    """One live unit of work. Deleted on ack, so `notification_id` is unique while live."""

    item_id = models.BigAutoField(primary_key=True)
    queue_name = models.CharField(max_length=100, default="default")
    priority = models.PositiveSmallIntegerField(default=5)
    payload_json = models.JSONField(default=dict)
    lock_token = models.UUIDField(null=True, blank=True)
    locked_until = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(db_default=Now())
    # Due when available_at <= now(); a claim leaves it as it is (see `ready`).
    available_at = models.DateTimeField(db_default=Now())
    # In the ready set: due now. False while waiting out a delay (backoff, a retry's delay, a delayed
    # enqueue), so the claim's indexes hold due items only and a claim costs the same whatever waits
    # for later (River's and Oban's `available` state); `queue.stage` moves due items back. A lease
    # leaves it true: a claim writes only lock_token, locked_until and attempts, which no index reads,
    # so it is a HOT update (no index entry; the table's fillfactor of 45 keeps room on the page), and
    # the claim checks the lease on the row (`queue._FREE`). Every write in `queueing/queue.py` (and the
    # record's `released`) sets it.
    ready = models.BooleanField(db_default=True)
    attempts = models.PositiveIntegerField(default=0)
    # What the item stands for and the lane it goes through, as opaque ids: the queue knows no table
    # above it (no foreign key, no join). The app that enqueues them (notifications: a notification and
    # its provider) removes its items itself when it deletes what they stand for (queue.remove_for).
    # Indexed by the unique constraint below, not twice.
    notification_id = models.UUIDField()
    # The lane: not indexed on its own, lanes use queue_state_lane_idx. Null: no lane to go through.
    provider_id = models.BigIntegerField(null=True, blank=True)
    # True when the lane or the tenant has a rate limit (`ratelimit.limited_sql` over `lane_limits`
    # and `tenants`, kept in sync when a limit changes by `queue.sync_rate_limited`): such items are
    # claimed only in per-lane queues capped by the tokens already granted, so an exhausted tenant
    # costs no claims.
    rate_limited = models.BooleanField(default=False)

    objects = QueueItemQuerySet.as_manager()

    class Meta:
        db_table = "queue_state"
        constraints = [
            models.UniqueConstraint(fields=["notification_id"], name="queue_state_one_live_item_per_notification"),
            models.CheckConstraint(condition=Q(priority__gte=0, priority__lte=9), name="queue_state_priority_0_9"),
        ]
        indexes = [
            # claim() over all queues: WHERE ready AND NOT rate_limited ORDER BY priority DESC, enqueued_at, item_id
            # (item_id: items enqueued by one statement share enqueued_at; the first inserted goes first).
            models.Index(
                fields=["-priority", "enqueued_at", "item_id"], condition=_READY_UNLIMITED_ANY_QUEUE,
                name="queue_state_ready_idx",
            ),
            # claim() for named queues, fair between tenants (queue.claim_ctes): the skip-scan that lists
            # each queue's tenants with ready work (one descent per queue and tenant), then one LATERAL
            # per tenant and queue: WHERE ready AND NOT rate_limited AND queue_name = ? AND tenant_id = ?
            # ORDER BY priority DESC, enqueued_at, item_id (another queue's depth costs nothing).
            models.Index(
                fields=["queue_name", "tenant", "-priority", "enqueued_at", "item_id"],
                condition=_READY_UNLIMITED,
                name="queue_state_queue_tenant_idx",
            ),
            # claim() over all queues, per tenant (fairness, queue.claim_ctes): the skip-scan that lists
            # tenants with ready work (one descent per tenant), then one LATERAL per tenant: WHERE ready
            # AND NOT rate_limited AND tenant_id = ? ORDER BY priority DESC, enqueued_at, item_id. Without
            # `priority >= 0`, as those statements are, so the planner cannot read queue_state_ready_idx for
            # them (every other tenant's items stepped over by filter, when statistics were taken while one
            # tenant filled the queue).
            models.Index(
                fields=["tenant", "-priority", "enqueued_at", "item_id"], condition=_READY_UNLIMITED_ALL_QUEUES,
                name="queue_state_tenant_idx",
            ),
            # claim()'s starvation branch per tenant, over all queues: WHERE ready AND NOT rate_limited AND
            # tenant_id = ? ORDER BY enqueued_at (aging reorders a tenant's own items only). Without
            # `priority >= 0`, as the branch is, so the planner cannot read queue_state_starving_all_idx
            # for it (every tenant's aged items in front of this one's).
            models.Index(
                fields=["tenant", "enqueued_at", "item_id"],
                condition=_READY_UNLIMITED_ALL_QUEUES,
                name="queue_state_tenant_aged_idx",
            ),
            # The console's queued filter: every tenant's ready items, newest enqueued first.
            models.Index(
                fields=["enqueued_at", "item_id"],
                condition=_READY_UNLIMITED_ANY_QUEUE,
                name="queue_state_starving_all_idx",
            ),
            models.Index(
                fields=["queue_name", "enqueued_at", "item_id"],
                condition=_READY_UNLIMITED,
                name="queue_state_starving_idx",
            ),
            # claim(), rate-limited lanes: WHERE ready AND rate_limited AND provider_id = ?
            # ORDER BY priority DESC, enqueued_at; and `queue.rate_limited_providers`.
            models.Index(
                fields=["provider_id", "-priority", "enqueued_at", "item_id"],
                condition=Q(ready=True, rate_limited=True),
                name="queue_state_lane_idx",
            ),
            # queue.stage(): WHERE NOT ready AND available_at <= now() ORDER BY available_at.
            models.Index(fields=["available_at"], condition=Q(ready=False), name="queue_state_delayed_idx"),
            # No index on enqueued_at alone: the planner read one for the starvation branch of a named
            # queue, filtering out every other queue's older items row by row.
        ]

    def __str__(self) -> str:
        return f"item {self.item_id} ({self.queue_name}, p{self.priority})"


DEFAULT_JOB_KIND = "notification"


class ScheduledJobQuerySet(TenantQuerySet):
    def pending(self) -> ScheduledJobQuerySet:
        return self.filter(status=ScheduledJob.Status.PENDING)

    def due(self) -> ScheduledJobQuerySet:
        return self.pending().filter(run_at__lte=Now())


class ScheduledJob(TenantOwned):
    class Status(models.TextChoices):
        PENDING = "pending"
        EXECUTED = "executed"
        CANCELLED = "cancelled"

    job_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # What the job promotes, as an opaque id (one job per notification): the handler the domain
    # registers (queueing.scheduler.register_promotion) knows what it is. No foreign key: whoever
    # deletes a notification deletes its job (operations.retention does, in the same statement).
    notification_id = models.UUIDField(unique=True)
    # Which registered handler promotes it (queueing.scheduler.register_promotion): `notification`, or
    # the kind another app registered (a workflow run waiting on a delay or a digest window).
    kind = models.CharField(max_length=20, default=DEFAULT_JOB_KIND, db_default=DEFAULT_JOB_KIND)
    run_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    executed_at = models.DateTimeField(null=True, blank=True)

    objects = ScheduledJobQuerySet.as_manager()

    class Meta:
        db_table = "scheduled_jobs"
        indexes = [
            # scheduler: WHERE status = 'pending' AND run_at <= now() ORDER BY run_at.
            models.Index(fields=["run_at"], condition=Q(status="pending"), name="scheduled_jobs_due_idx"),
            models.Index(fields=["tenant", "-created_at"], name="scheduled_jobs_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} at {self.run_at:%Y-%m-%d %H:%M:%S} ({self.status})"


class WorkerQuerySet(models.QuerySet):
    def live(self) -> WorkerQuerySet:
        cutoff = timezone.now() - timedelta(seconds=settings.OMNIPOST_WORKER_STALE_SECONDS)
        return self.filter(stopped_at__isnull=True, last_seen__gte=cutoff)

    def stale(self) -> WorkerQuerySet:
        cutoff = timezone.now() - timedelta(seconds=settings.OMNIPOST_WORKER_STALE_SECONDS)
        return self.filter(stopped_at__isnull=True, last_seen__lt=cutoff)


class Worker(models.Model):
    """A dispatcher or scheduler process, as its heartbeat last described it."""

    class Kind(models.TextChoices):
        DISPATCHER = "dispatcher"
        SCHEDULER = "scheduler"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=12, choices=Kind.choices)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())
    stopped_at = models.DateTimeField(null=True, blank=True)
    processed = models.PositiveBigIntegerField(default=0)
    # Times the process dropped a lost database session and reconnected (core.db_faults).
    reconnects = models.PositiveIntegerField(default=0)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        db_table = "workers"
        ordering = ["-last_seen"]

    def __str__(self) -> str:
        return f"{self.kind} {self.host}:{self.pid}"

    @property
    def is_alive(self) -> bool:
        stale = timedelta(seconds=settings.OMNIPOST_WORKER_STALE_SECONDS)
        return self.stopped_at is None and timezone.now() - self.last_seen < stale


class RateBucket(models.Model):
    """A token bucket shared by every process: `tokens = min(burst, tokens + elapsed * rate)`.

    Keys are `provider:<id>` and `tenant:<id>`. `effective_rate` is the adaptive rate (lowered
    on 429s, raised back toward `rate` on success).
    """

    key = models.CharField(primary_key=True, max_length=100)
    rate = models.FloatField()
    effective_rate = models.FloatField()
    burst = models.FloatField()
    tokens = models.FloatField()
    updated_at = models.DateTimeField(db_default=Now())
    decreased_at = models.DateTimeField(null=True, blank=True)
    increased_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "rate_limit_buckets"

    def __str__(self) -> str:
        return f"{self.key}: {self.effective_rate:g}/s"


class LaneLimit(TenantOwned):
    """The configured rate limit of one lane (a `queue_state.provider_id`), as the app that owns the
    lanes sets it: providers keep one row per provider with a `rate_limit` (providers.lanes).
    A lane without a limit has no row. Whether a new item is rate-limited is decided from these rows
    and the tenant's own limit (`ratelimit.limited_sql`), so the queue reads no table above it."""

    lane_id = models.BigIntegerField(primary_key=True)
    rate_per_second = models.FloatField()
    burst = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "lane_limits"

    def __str__(self) -> str:
        return f"lane {self.lane_id}: {self.rate_per_second:g}/s"
