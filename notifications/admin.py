"""Admin for notifications. Staff see only their tenants
(TenantScopedAdmin); recipients appear only masked."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import BooleanField, F, Func, Q, Subquery, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Now
from django.http import HttpRequest
from django.utils.safestring import mark_safe

from core.admin_scoping import ReadOnlyMixin, TenantScopedAdmin, visible_tenant_ids
from notifications.models import (
    LEASABLE,
    DeliveryAttempt,
    Notification,
    NotificationDevice,
    ReceiptStatus,
    Status,
    TenantQueue,
)
from queueing.models import QueueItem, ScheduledJob
from queueing.stats import CappedCountPaginator, leased_notifications_sql

MAX_QUEUE_CHOICES = 200


class AttemptInline(ReadOnlyMixin, admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    fields = ["number", "outcome", "started_at", "finished_at", "duration_ms", "http_status", "error_class",
              "error_code", "error_message", "provider"]  # fmt: skip
    readonly_fields = fields
    ordering = ["number"]


class DeviceResultInline(ReadOnlyMixin, admin.TabularInline):
    """A push's devices and how each went (the device's token is never shown: its id only)."""

    model = NotificationDevice
    extra = 0
    fields = ["device_id", "kind", "status", "error_code", "updated_at"]
    readonly_fields = fields
    ordering = ["id"]
    verbose_name_plural = "devices"


def id_in(ids: Any) -> Any:
    """`id = ANY(ARRAY(<ids>))`: the planner can only look each id up in notifications_pkey (for
    `id IN (<ids>)` it hash-joins a sequential scan of notifications once the ids are a few thousand)."""
    return Func(F("id"), ArraySubquery(ids), arg_joiner=" = ANY(", template="%(expressions)s)",
                output_field=BooleanField())  # fmt: skip


# Statuses whose notifications an app above this one keeps a small table of (the DLQ: failed and
# dead_lettered), registered by that app (dlq.apps): a callable returning its rows, newest first, with
# `notification_id` and `tenant_id` columns (STYLE 4a: the lower layer is handed what it needs).
STATUS_SOURCES: dict[str, Any] = {}


def register_status_source(statuses: tuple[str, ...], rows: Any) -> None:
    for status in statuses:
        STATUS_SOURCES[status] = rows


class StatusFilter(admin.SimpleListFilter):
    """The status, choices from the constants (no DISTINCT over the table), each read from the small live
    table that holds such notifications: its newest CappedCountPaginator.cap rows through its own index,
    then each notification through notifications_pkey (`id = ANY(ARRAY(…))`), its stored status checked
    on the row found, newest first. No index on notifications names `status`: one would make every
    delivery's status update (the dispatcher's hot path) non-HOT and write every index.

    - queued: its queue item (unique per notification) not under a live lease, newest enqueued first:
      ready ones through queue_state_starving_all_idx, rate-limited ones through queue_state_lane_idx,
      due not-ready ones (a retry not staged yet) through queue_state_delayed_idx;
    - retrying: a not-ready item (queue_state_delayed_idx, latest available_at first), not leased;
    - dispatching: an item under a live lease, latest lease end first; a claim changes no indexed
      column, so the leases are read at the fronts of the claim's orders
      (queueing.stats.leased_notifications_sql);
    - scheduled: a pending job (scheduled_jobs_due_idx, latest run_at first);
    - failed / dead_lettered: a dead-letter entry (the record writes one for both; dlq_console_*_idx);
    - delivered: nearly every row, so the plain created_at-ordered list stops after a page;
    - cancelled, suppressed: see `_finished_without_trace`.
    Past `cap` rows of the small table the list ends (the capped paginator shows no more either).
    """

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s.value, s.label) for s in Status]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value not in Status.values:
            return queryset
        if value == Status.DELIVERED:
            return queryset.filter(status=value)
        cap = CappedCountPaginator.cap
        tenants = None if request.user.is_superuser else visible_tenant_ids(request)

        def scoped(rows: Any) -> Any:
            return rows if tenants is None else rows.filter(tenant_id__in=tenants)

        items = QueueItem.objects.values("notification_id")
        free = Q(lock_token__isnull=True) | Q(locked_until__lte=Now())  # no live lease
        statuses: tuple[str, ...] = (value,)
        if value == Status.QUEUED:
            ready = items.filter(free, ready=True, rate_limited=False, priority__gte=0).order_by("-enqueued_at")
            limited = items.filter(free, ready=True, rate_limited=True).order_by("-enqueued_at")
            # Not ready yet due: a retry until stage() marks it ready (a retrying item waits in the future
            # and stays out).
            waiting = items.filter(free, ready=False, available_at__lte=Now()).order_by("-available_at")
            ids = ready[:cap].union(limited[:cap], waiting[:cap], all=True)
        elif value == Status.RETRYING:
            ids = items.filter(free, ready=False).order_by("-available_at")[:cap]
        elif value == Status.DISPATCHING:
            sql, params = leased_notifications_sql(cap, tenants)
            statuses = (*LEASABLE, Status.DISPATCHING)  # rows written `dispatching` by earlier versions
            leased = RawSQL(  # noqa: S611 - queueing's fixed fragments; the tenants are a parameter
                f"{Notification._meta.db_table}.id = ANY(ARRAY({sql}))", params, output_field=BooleanField()
            )
            return queryset.filter(leased, status__in=statuses)
        elif value == Status.SCHEDULED:
            ids = scoped(ScheduledJob.objects.pending()).order_by("-run_at").values("notification_id")[:cap]
        elif value in STATUS_SOURCES:
            ids = scoped(STATUS_SOURCES[value]()).values("notification_id")[:cap]
        else:
            return self._finished_without_trace(queryset, scoped, cap, value)
        return queryset.filter(id_in(ids), status__in=statuses)

    @staticmethod
    def _finished_without_trace(queryset: Any, scoped: Any, cap: int, value: str) -> Any:
        """Cancelled (and suppressed) notifications leave no live row behind (their queue item is deleted;
        a scheduled one's job is kept, but scheduled_jobs grows with every schedule and has no index that finds
        cancelled jobs), so this is a bounded scan: among the newest `cap` notifications (the boundary read from
        notif_created_idx / notif_tenant_recent_idx, `cap` index entries), the cancelled ones, newest first
        through the same index. Cost per page: up to `cap` (10,000) index entries for the boundary plus the
        rows walked until a page of cancelled ones is found (≈ 50 / their share of recent rows; at most
        `cap`): ≈ 5–30 ms whatever the table's size. An older cancelled notification is not listed (open
        it by id, or ask the API with status=cancelled)."""
        newest = scoped(Notification.objects.all()).order_by("-created_at").values("created_at")[cap - 1 : cap]
        since = Coalesce(Subquery(newest), Value(datetime(1970, 1, 1, tzinfo=UTC)))
        return queryset.filter(status=value, created_at__gte=since)


class ReceiptFilter(admin.SimpleListFilter):
    """What the provider reported (choices from the constants). Rows with a receipt are in the partial
    indexes notif_receipt_idx (every tenant, newest first) and notif_tenant_receipt_idx (one tenant's),
    so a page reads a page of index entries."""

    title = "receipt"
    parameter_name = "receipt"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(r.value, r.label) for r in ReceiptStatus]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(receipt=self.value()) if self.value() in ReceiptStatus.values else queryset


# Inlines of the notification page that apps above this one contribute (receipts' events), registered
# from their admin modules (STYLE 4a).
NOTIFICATION_INLINES: list[type[admin.options.InlineModelAdmin]] = []


def register_notification_inline(inline: type[admin.options.InlineModelAdmin]) -> None:
    if inline not in NOTIFICATION_INLINES:
        NOTIFICATION_INLINES.append(inline)


class QueueFilter(admin.SimpleListFilter):
    """Queue names from tenant_queues (bounded per tenant by OMNIPOST_MAX_QUEUES_PER_TENANT), not a
    DISTINCT over notifications."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = TenantQueue.objects.all()
        if not request.user.is_superuser:
            names = names.filter(tenant_id__in=visible_tenant_ids(request))
        found = set(names.values_list("name", flat=True)[:MAX_QUEUE_CHOICES]) | {"default"}
        return [(name, name) for name in sorted(found)]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class ModeFilter(admin.SimpleListFilter):
    """Live or test data (created with a test key, sent to the simulator)."""

    title = "mode"
    parameter_name = "mode"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "Live"), ("test", "Test")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        return queryset.filter(test=value == "test") if value in ("live", "test") else queryset


TEST_BADGE = (
    '<span class="omnipost-test-badge" style="background:#f0ad4e;color:#000;padding:1px 6px;'
    'border-radius:3px;font-weight:bold;font-size:0.8em">TEST</span>'
)


class LiveStatusMixin:
    """A `status` column showing the live status (needs the `leased` annotation)."""

    @admin.display(description="status", ordering="status")
    def status_now(self, obj: Notification) -> str:
        return Status(obj.live_status).label


@admin.register(Notification)
class NotificationAdmin(LiveStatusMixin, ReadOnlyMixin, TenantScopedAdmin):
    """Stays fast at any size: the list reads one page through an index (ordered as notif_created_idx /
    notif_tenant_recent_idx are), counts at most CappedCountPaginator.cap rows, offers filter choices
    from constants and small tables, has no date hierarchy (its MIN/MAX and DISTINCT day read every
    row), and finds an id through the primary key. The live status (a lease on the queue item) is
    read for the one notification on its page, not per row of the list."""

    list_display = ["id", "mode", "tenant", "channel", "recipient_masked", "provider", "status", "receipt",
                    "priority", "queue", "attempt_count", "created_at"]  # fmt: skip
    list_filter = [StatusFilter, ReceiptFilter, ModeFilter, "channel", QueueFilter]
    search_fields = ["=id"]  # the search itself is get_search_results
    search_help_text = "Search by notification id."
    list_select_related = ["tenant", "provider"]
    ordering = ["-created_at", "-id"]
    list_per_page = 50  # rendering a row's ten cells costs more than reading it
    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a COUNT per filter choice would scan the table on every page
    # `recipient` (ciphertext at rest, plaintext once decrypted) is deliberately absent.
    fields = ["id", "mode", "tenant", "channel", "recipient_masked", "provider", "template", "template_version",
              "locale", "status_now", "priority",
              "queue", "scheduled_for", "enqueued_at", "delivered_at", "receipt", "bounce_type", "attempt_count",
              "attempt_offset", "last_error_code", "subject", "body", "html_body", "context", "metadata",
              "fallback", "fallback_notification_id", "fallback_of", "created_at", "updated_at"]  # fmt: skip
    readonly_fields = fields
    inlines = [AttemptInline, DeviceResultInline]

    def get_inlines(self, request: HttpRequest, obj: Any) -> list[Any]:
        return [*self.inlines, *NOTIFICATION_INLINES]

    @admin.display(description="mode", ordering="test")
    def mode(self, obj: Notification) -> str:
        """A badge on test data (a test key's, sent to the simulator); nothing on live data."""
        return mark_safe(TEST_BADGE) if obj.test else ""  # noqa: S308 - a constant

    def get_list_display(self, request: HttpRequest) -> list[str]:
        """The tenant column only for those who see more than one tenant."""
        columns = list(super().get_list_display(request))
        if not request.user.is_superuser and len(visible_tenant_ids(request)) < 2:
            columns.remove("tenant")
        return columns

    def get_ordering(self, request: HttpRequest) -> list[str]:
        """One tenant's staff: led by the (constant) tenant, which only notif_tenant_recent_idx can give in
        order. Ordered by created_at alone, the planner reads notif_created_idx (it looks sequential on disk)
        and drops every other tenant's rows one by one."""
        if not request.user.is_superuser and len(visible_tenant_ids(request)) == 1:
            return ["tenant_id", *self.ordering]
        return list(self.ordering)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        try:
            pk = uuid.UUID(str(object_id))
        except ValueError:
            return None
        return self.get_queryset(request).with_live_status().filter(pk=pk).first()

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> tuple[Any, bool]:
        """An exact id through the primary key (Django's `=id` would compare UPPER(id::text))."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            return queryset.none(), False
