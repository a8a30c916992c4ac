"""Feed items in the console, read-only (the subscriber changes their states through /inbox/v1/): a
list per tenant (TenantScopedAdmin: staff see only their tenants') with filters by state and
category, a subscriber found by its exact external id (inbox_feed_idx), and each item's content
masked as every output of the console is (addresses, phone numbers, keys, secret-named data)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from core.admin_scoping import ReadOnlyMixin, TenantScopedAdmin
from core.masking import mask_mapping, mask_text
from inbox.models import InboxItem

# state -> what selects it (the feed API's: `unread` and `unseen` leave archived items out)
STATES = {
    "unseen": {"seen_at__isnull": True, "archived_at__isnull": True},
    "unread": {"read_at__isnull": True, "archived_at__isnull": True},
    "read": {"read_at__isnull": False, "archived_at__isnull": True},
    "archived": {"archived_at__isnull": False},
}


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:  # noqa: ANN401
        return [(state, state) for state in STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(**STATES[self.value()]) if self.value() in STATES else queryset


@admin.register(InboxItem)
class InboxItemAdmin(ReadOnlyMixin, TenantScopedAdmin):
    list_display = ["masked_title", "subscriber", "category", "state", "tenant", "created_at"]
    list_filter = [StateFilter, "category"]
    search_fields = ["=subscriber"]
    search_help_text = "A subscriber's exact external id."
    ordering = ["-created_at", "-id"]
    fields = readonly_fields = ["id", "tenant", "subscriber", "notification", "category", "masked_title",
                                "masked_body", "masked_data", "masked_action_url", "created_at", "seen_at", "read_at",
                                "archived_at", "expires_at", "seq"]  # fmt: skip

    @admin.display(description="title")
    def masked_title(self, obj: InboxItem) -> str:
        return mask_text(obj.title) or "—"

    @admin.display(description="body")
    def masked_body(self, obj: InboxItem) -> str:
        return mask_text(obj.body)

    @admin.display(description="data")
    def masked_data(self, obj: InboxItem) -> Any:  # noqa: ANN401
        return mask_mapping(obj.data)

    @admin.display(description="action URL")
    def masked_action_url(self, obj: InboxItem) -> str:
        return mask_text(obj.action_url)

    @admin.display(description="state")
    def state(self, obj: InboxItem) -> str:
        if obj.archived_at:
            return "archived"
        return "read" if obj.read_at else "seen" if obj.seen_at else "unseen"

    @admin.display(description="notification")
    def notification(self, obj: InboxItem) -> str:
        url = reverse("admin:notifications_notification_change", args=[obj.notification_id])
        return format_html('<a href="{}">{}</a>', url, obj.notification_id)
