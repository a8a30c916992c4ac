"""Workflows in the console: definitions (read-only: the API defines them), runs, each run's steps as
a timeline with a link to each step's notification, and topic fan-outs with their progress and an
action that cancels running ones (through workflows.services.cancel_fanout, which writes the audit
event). Staff see only their tenants' (TenantScopedAdmin)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from core.admin_scoping import ReadOnlyMixin, TenantScopedAdmin, each_selected
from queueing.stats import CappedCountPaginator
from workflows import services
from workflows.models import Fanout, Workflow, WorkflowRun, resolve_runs


@admin.register(Workflow)
class WorkflowAdmin(ReadOnlyMixin, TenantScopedAdmin):
    """Workflows, and sequences (a workflow of their kind: send steps with delays between)."""

    list_display = ["key", "kind", "name", "tenant", "category", "step_count", "updated_at"]
    list_filter = ["kind"]
    search_fields = ["=key"]
    ordering = ["-created_at", "-id"]
    fields = readonly_fields = ["key", "kind", "name", "tenant", "category", "steps", "created_at", "updated_at"]

    @admin.display(description="steps")
    def step_count(self, obj: Workflow) -> int:
        return len(obj.steps or [])


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ReadOnlyMixin, TenantScopedAdmin):
    """Runs, and sequences' enrollments (runs to a recipient: `recipient` is never shown, only masked)."""

    list_display = ["id", "workflow", "subscriber", "recipient_masked", "status", "tenant", "created_at"]
    list_filter = ["status"]
    list_select_related = ("tenant", "workflow")
    search_fields = ["=subscriber", "=trigger_id"]
    ordering = ["-created_at", "-id"]
    fields = readonly_fields = ["id", "workflow", "tenant", "subscriber", "recipient_masked", "trigger_id", "status",
                                "cancellation_key", "actor", "timeline", "run_data", "digest", "starts_at",
                                "created_at", "updated_at"]  # fmt: skip

    @admin.display(description="data")
    def run_data(self, obj: WorkflowRun) -> Any:  # noqa: ANN401
        return _resolved(obj).data

    @admin.display(description="steps")
    def timeline(self, obj: WorkflowRun) -> Any:  # noqa: ANN401
        def row(state: dict[str, Any]) -> tuple[Any, ...]:
            note = state.get("notification_id")
            link = (format_html('<a href="{}">{}</a>', reverse("admin:notifications_notification_change", args=[note]),
                                note) if note else "—")  # fmt: skip
            return (state.get("name"), state.get("type"), state.get("status"), state.get("at") or "",
                    state.get("reason") or "", link)  # fmt: skip

        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                                (row(state) for state in _resolved(obj).steps or []))  # fmt: skip
        return format_html(
            "<table><thead><tr><th>step</th><th>type</th><th>status</th><th>resumes at</th><th>reason</th>"
            "<th>notification</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )


@admin.register(Fanout)
class FanoutAdmin(ReadOnlyMixin, TenantScopedAdmin):
    """Workflow triggers to a topic: runs created of the topic's members at the trigger, chunks, and
    when it started and finished. Every figure is a column of the fan-out's own row."""

    list_display = ["id", "workflow", "topic_key", "tenant", "status", "progress_bar", "chunks", "created_at",
                    "finished_at"]  # fmt: skip
    list_filter = ["status"]
    list_select_related = ("tenant", "workflow")
    search_fields = ["=id", "=topic_key"]
    ordering = ["-created_at", "-id"]
    paginator = CappedCountPaginator
    actions = ["cancel_selected"]
    fields = readonly_fields = ["id", "workflow", "tenant", "topic_key", "status", "progress_bar", "total", "created",
                                "chunks", "cancellation_key", "actor", "data", "test", "created_at",
                                "finished_at"]  # fmt: skip

    @admin.display(description="progress")
    def progress_bar(self, obj: Fanout) -> Any:  # noqa: ANN401
        return format_html('<progress max="{}" value="{}" style="width:10em"></progress> {} / {} runs',
                           obj.total, obj.created, f"{obj.created:,}", f"{obj.total:,}")  # fmt: skip

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("workflows.cancel_fanout")

    @admin.action(description="Cancel selected fan-outs (members not reached yet get no run)", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        actor = f"user:{request.user.get_username()}"
        done, refused = each_selected(queryset, lambda pk: services.cancel_fanout(None, pk, actor=actor))
        if done:
            self.message_user(request, f"Cancelled {done} fan-out(s).", messages.SUCCESS)
        if refused:
            self.message_user(request, f"{refused} not cancelled: only running fan-outs can be.", messages.WARNING)


def _resolved(run: WorkflowRun) -> WorkflowRun:
    """A fan-out's run shows its fan-out's data and steps while it leaves them NULL."""
    resolve_runs([run])
    return run
