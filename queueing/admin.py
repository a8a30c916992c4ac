"""The queue in the console: read-only lists of live queue items, scheduled jobs and workers, and the
operations dashboard (admin/dashboard/) that the admin index links to.

Lists never COUNT(*) a whole table (CappedCountPaginator, show_full_result_count = False) and their
filters have fixed choices, so no filter runs SELECT DISTINCT over a big table. Staff see only their
tenants' rows and figures; workers are shared infrastructure and visible to every operator.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from core.admin_scoping import DefaultStatusFilter, TenantScopedAdmin, visible_tenants
from queueing import stats
from queueing.models import LEASED, QueueItem, ScheduledJob, Worker

DASHBOARD_PERMISSION = "queueing.view_queueitem"


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
        "notification_id", "provider", "rate_limited",
    ]  # fmt: skip
    list_filter = [QueueStateFilter, PriorityFilter, "rate_limited"]
    list_select_related = ("tenant", "provider")
    search_fields = ["=queue_name"]
    search_help_text = "A queue name, or a notification id."
    ordering = ["item_id"]  # first enqueued first: the primary key (an index on enqueued_at misled claims)
    paginator = stats.CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    fields = [
        "item_id", "tenant", "queue_name", "priority", "state", "attempts", "enqueued_at", "available_at",
        "locked_until", "lock_token", "notification_id", "provider", "rate_limited", "payload_json",
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
    list_display = ["__str__", "kind", "alive", "last_seen", "started_at", "processed", "queue_list", "stopped_at"]
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


# --- dashboard ---------------------------------------------------------------------------------------


def _n(value: int) -> str:
    return f"{value:,}"


def _age(seconds: float) -> str:
    """3.2s, 4m 05s, 2h 10m, 3d 4h."""
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours < 48 else f"{hours // 24}d {hours % 24}h"


def _chart(minutes: list[stats.Minute], value: Any, width: int = 720, height: int = 120) -> dict[str, Any]:
    """Bar geometry for an inline SVG: one bar per minute, scaled to the busiest minute."""
    values = [value(m) for m in minutes]
    peak = max(values, default=0)
    slot = width / max(1, len(values))
    bars = []
    for i, (m, v) in enumerate(zip(minutes, values, strict=True)):
        h = 0.0 if not peak else max(1.5 if v else 0.0, v / peak * (height - 4))
        bars.append({"x": round(i * slot + 1, 1), "y": round(height - h, 1), "w": round(slot - 2, 1),
                     "h": round(h, 1), "label": f"{m.start:%H:%M} UTC: {v:,}"})  # fmt: skip
    return {"bars": bars, "peak": _n(peak), "total": _n(sum(values)), "width": width, "height": height}


def _queue_rows(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows with a heat-map cell per priority (9 … 0), shaded against the fullest cell."""
    peak = max([n for q in figures for n in q["by_priority"].values()], default=0) or 1
    return [
        {
            "queue": q["queue"], "depth": _n(q["depth"]), "ready": _n(q["ready"]), "leased": _n(q["leased"]),
            "delayed": _n(q["delayed"]), "oldest": _age(q["oldest_age_seconds"]),
            "cells": [
                {"text": _n(n) if n else "·", "alpha": round(0.08 + 0.6 * n / peak, 2) if n else 0}
                for n in (q["by_priority"][str(p)] for p in range(9, -1, -1))
            ],
        }  # fmt: skip
        for q in figures
    ]


def _tone(value: float, warn: float, bad: float) -> str:
    return "bad" if value > bad else "warn" if value > warn else "ok"


def dashboard_view(request: HttpRequest) -> HttpResponse:
    """Queue depth by queue and priority, oldest ready age, last hour's throughput, DLQ size, workers."""
    if not request.user.has_perm(DASHBOARD_PERMISSION):
        raise PermissionDenied
    tenants = None if request.user.is_superuser else list(visible_tenants(request).values_list("pk", "name"))
    tenant_ids = None if tenants is None else [pk for pk, _ in tenants]
    figures, exact = stats.queue_figures_sized(tenant_ids)
    total = stats.totals(figures)
    about = "" if exact else "≈"
    minutes = stats.throughput(tenant_ids)
    dlq_open = stats.dlq_open(tenant_ids)
    delivered, failed = _chart(minutes, lambda m: m.delivered), _chart(minutes, lambda m: m.failed)
    transient, permanent = sum(m.transient for m in minutes), sum(m.permanent for m in minutes)
    workers = stats.workers()
    live = sum(1 for w in workers if w.alive)
    cards = [
        {"id": "depth", "label": "Queue depth", "value": about + _n(total["depth"]),
         "hint": f"{len(figures)} queue{'s' if len(figures) != 1 else ''}"},
        {"id": "ready", "label": "Ready", "value": about + _n(total["ready"]), "hint": "claimable now"},
        {"id": "leased", "label": "Leased", "value": about + _n(total["leased"]), "hint": "being delivered"},
        {"id": "delayed", "label": "Delayed", "value": about + _n(total["delayed"]), "hint": "waiting for backoff"},
        {"id": "oldest", "label": "Oldest ready", "value": _age(total["oldest_age_seconds"]),
         "hint": "age of the oldest ready item", "tone": _tone(total["oldest_age_seconds"], 30, 300)},
        {"id": "dlq", "label": "DLQ open", "value": str(dlq_open), "hint": "entries awaiting an operator",
         "tone": "bad" if dlq_open.count else "ok", "link": "admin:dlq_deadletter_changelist"},
        {"id": "delivered", "label": "Delivered · 1 h", "value": delivered["total"],
         "hint": f"peak {delivered['peak']}/min", "tone": "ok"},
        {"id": "failed", "label": "Failed attempts · 1 h", "value": failed["total"],
         "hint": f"{transient:,} transient · {permanent:,} permanent", "tone": "warn" if transient + permanent else ""},
        {"id": "workers", "label": "Workers", "value": f"{live} live",
         "hint": f"{len(workers) - live} stale" if len(workers) > live else "all heartbeating",
         "tone": "bad" if not live else "warn" if len(workers) > live else "ok"},
    ]  # fmt: skip
    if tenant_ids is None:
        estimate = stats.estimated_rows("notifications")
        if estimate is not None:
            cards.append({"id": "notifications", "label": "Notifications", "value": f"≈{estimate:,}",
                          "hint": "table size, planner estimate"})  # fmt: skip
    context = {
        **admin.site.each_context(request),
        "title": "Operations dashboard",
        "scope": "all tenants" if tenants is None else ", ".join(name for _, name in tenants) or "no tenant",
        "cards": cards,
        "queue_rows": _queue_rows(figures),
        "figures_exact": exact,
        "priorities": [str(p) for p in range(9, -1, -1)],
        "charts": [
            ("deliveries", "Deliveries", "#2e8540", delivered),
            ("failures", "Failed attempts", "#ba2121", failed),
        ],
        "workers": [
            {"alive": w.alive, "process": f"{w.worker.host}:{w.worker.pid}", "kind": w.worker.kind,
             "queues": ", ".join(w.worker.queues or []) or "*", "seen": f"{_age(w.seen_seconds_ago)} ago",
             "processed": _n(w.worker.processed), "started": w.worker.started_at}
            for w in workers
        ],  # fmt: skip
    }
    return TemplateResponse(request, "admin/dashboard.html", context)


def _with_dashboard(get_urls: Any) -> Any:
    def urls() -> list:
        return [path("dashboard/", admin.site.admin_view(dashboard_view), name="dashboard"), *get_urls()]

    return urls


if not getattr(admin.site.get_urls, "with_dashboard", False):
    admin.site.get_urls = _with_dashboard(admin.site.get_urls)
    admin.site.get_urls.with_dashboard = True
