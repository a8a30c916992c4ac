"""Bulk sends in the console: each job with a progress bar (rows created of the file's, and delivered),
its errors, and an action that cancels jobs (through bulk.services.cancel, which writes the audit
event). Staff see only their tenants' (TenantScopedAdmin)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from bulk import services
from bulk.models import BulkSend, BulkStatus
from core.admin_scoping import ReadOnlyMixin, TenantScopedAdmin, each_selected


def actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


@admin.register(BulkSend)
class BulkSendAdmin(ReadOnlyMixin, TenantScopedAdmin):
    list_display = ["__str__", "tenant", "status", "rows", "progress_bar", "error_count", "created_at"]
    list_filter = ["status"]
    list_select_related = ("tenant", "template", "workflow")
    list_per_page = 25  # a running job's delivered count is one query over its notifications
    search_fields = ["=id", "name"]
    ordering = ["-created_at", "-id"]
    actions = ["cancel_selected"]
    fields = readonly_fields = [
        "id", "name", "tenant", "channel", "template", "workflow", "addressed_by", "status", "rows", "progress_bar",
        "progress_counts", "error_list", "error_count", "scheduled_for", "test", "created_at", "started_at",
        "completed_at", "cancelled_at",
    ]  # fmt: skip

    @admin.display(description="progress")
    def progress_bar(self, obj: BulkSend) -> Any:  # noqa: ANN401
        if obj.status == BulkStatus.INVALID:
            return "—"
        counts = services.progress(obj)
        return format_html(
            '<progress max="{}" value="{}" style="width:10em"></progress> {} / {} created · {} delivered',
            obj.rows, counts["created"], f"{counts['created']:,}", f"{obj.rows:,}", f"{counts['delivered']:,}",
        )  # fmt: skip

    @admin.display(description="counts")
    def progress_counts(self, obj: BulkSend) -> str:
        return ", ".join(f"{name} {value:,}" for name, value in services.progress(obj).items())

    @admin.display(description="errors (first 100)")
    def error_list(self, obj: BulkSend) -> Any:  # noqa: ANN401
        if not obj.errors:
            return "—"
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                                ((e["row"], e["column"] or "", e["message"]) for e in obj.errors))  # fmt: skip
        return format_html("<table><thead><tr><th>row</th><th>column</th><th>message</th></tr></thead>"
                           "<tbody>{}</tbody></table>", rows)  # fmt: skip

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("bulk.cancel_bulksend")

    @admin.action(description="Cancel selected bulk sends (rows not created yet are never sent)",
                  permissions=["cancel"])  # fmt: skip
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        done, refused = each_selected(queryset, lambda pk: services.cancel(None, pk, actor=actor(request)))
        if done:
            self.message_user(request, f"Cancelled {done} bulk send(s).", messages.SUCCESS)
        if refused:
            self.message_user(request, f"{refused} not cancelled: only ready or sending jobs can be.", messages.WARNING)
