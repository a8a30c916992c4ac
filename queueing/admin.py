"""The queue in the console: read-only lists of live queue items, scheduled jobs and workers (the
operations dashboard that reads them is omnipost_site.ops.dashboard).

Lists never COUNT(*) a whole table (CappedCountPaginator, show_full_result_count = False) and their
filters have fixed choices, so no filter runs SELECT DISTINCT over a big table. Staff see only their
tenants' rows and figures; workers are shared infrastructure and visible to every operator.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils import timezone

from core.admin_scoping import DefaultStatusFilter, TenantScopedAdmin
from queueing import stats
from queueing.models import LEASED, QueueItem, ScheduledJob, Worker


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PriorityFilter(admin.SimpleListFilter):
    title = "priority"
    parameter_name = "priority"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(p), str(p)) for p in range(9, -1, -1)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(priority=int(self.value())) if self.value() else queryset


class QueueStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("ready", "ready"), ("leased", "leased"), ("delayed", "delayed (retry/backoff)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "ready":
            return queryset.filter(available_at__lte=Now()).exclude(LEASED)
        if value == "leased":
            return queryset.filter(LEASED)
        if value == "delayed":
            return queryset.filter(available_at__gt=Now()).exclude(LEASED)
        return queryset


@admin.register(QueueItem)
class QueueItemAdmin(ReadOnlyAdmin, TenantScopedAdmin):
    list_display = [
        "item_id", "tenant", "queue_name", "priority", "state", "attempts", "enqueued_at", "available_at",
        "notification_id", "provider_id", "rate_limited",
    ]  # fmt: skip
    list_filter = [QueueStateFilter, PriorityFilter, "rate_limited"]
    list_select_related = ("tenant",)
    search_fields = ["=queue_name"]
    search_help_text = "A queue name, or a notification id."
    ordering = ["item_id"]  # first enqueued first: the primary key (an index on enqueued_at misled claims)
    paginator = stats.CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = [
        "item_id", "tenant", "queue_name", "priority", "state", "attempts", "enqueued_at", "available_at",
        "locked_until", "lock_token", "notification_id", "provider_id", "rate_limited", "payload_json",
    ]  # fmt: skip
    readonly_fields = fields

    @admin.display(description="state")
    def state(self, item: QueueItem) -> str:
        now = timezone.now()
        if item.lock_token is not None and item.locked_until and item.locked_until > now:
            return "leased"
        return "ready" if item.available_at <= now else "delayed"

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(notification_id=uuid.UUID(term)), False
        except ValueError:
            return queryset.filter(queue_name=term), False


class JobStatusFilter(DefaultStatusFilter):
    """Pending by default: the partial index scheduled_jobs_due_idx serves it, ordered by run_at."""

    statuses = ScheduledJob.Status
    default = ScheduledJob.Status.PENDING


@admin.register(ScheduledJob)
class ScheduledJobAdmin(ReadOnlyAdmin, TenantScopedAdmin):
    list_display = ["job_id", "tenant", "notification_id", "run_at", "status", "created_at", "executed_at"]
    list_filter = [JobStatusFilter]
    list_select_related = ("tenant",)
    search_fields = ["=job_id"]
    search_help_text = "A job id or a notification id."
    ordering = ["run_at"]
    paginator = stats.CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = ["job_id", "tenant", "notification_id", "run_at", "status", "created_at", "executed_at"]
    readonly_fields = fields

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            value = uuid.UUID(term)
        except ValueError:
            return queryset.none(), False
        return queryset.filter(Q(job_id=value) | Q(notification_id=value)), False


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = [
        "__str__", "kind", "host", "pid", "alive", "last_seen", "started_at", "processed", "queue_list", "stopped_at",
    ]  # fmt: skip
    list_filter = ["kind"]
    ordering = ["-last_seen"]
    fields = ["id", "kind", "host", "pid", "queues", "started_at", "last_seen", "stopped_at", "processed"]
    readonly_fields = fields

    @admin.display(boolean=True, description="live")
    def alive(self, worker: Worker) -> bool:
        return worker.is_alive

    @admin.display(description="queues")
    def queue_list(self, worker: Worker) -> str:
        return ", ".join(worker.queues or []) or "*"
