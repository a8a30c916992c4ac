from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from core import services
from core.admin_scoping import TenantScopedAdmin, visible_tenants
from core.models import ApiKey, AuditEvent, Tenant, TenantMembership

admin.site.site_header = "OmniPost operations"
admin.site.site_title = "OmniPost operations"
admin.site.index_title = "Operations console"
# The collapsible app list beside every page took a quarter of a 1280 px screen from the lists an operator
# reads (the DLQ's last columns fell out of sight); the breadcrumbs and the index lead everywhere instead.
admin.site.enable_nav_sidebar = False


class MembershipInline(admin.TabularInline):
    model = TenantMembership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "id", "is_active", "weight", "rate_per_second", "created_at"]
    search_fields = ["name", "id"]
    inlines = [MembershipInline]

    def get_queryset(self, request: HttpRequest) -> Any:
        return visible_tenants(request)


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    list_display = ["__str__", "tenant", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name"]
    fields = ["tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        # A key never moves to another tenant; revocation is permanent and goes through the action.
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "tenant"] if obj is not None else fields

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        raw = services.issue_api_key(obj, actor=f"user:{request.user.get_username()}")
        self.message_user(request, f"New API key (shown once, copy it now): {raw}", messages.WARNING)

    @admin.action(description="Revoke selected API keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        revoked = services.revoke_api_keys(list(queryset), actor=f"user:{request.user.get_username()}")
        self.message_user(request, f"Revoked {revoked} key(s).")


@admin.register(AuditEvent)
class AuditEventAdmin(TenantScopedAdmin):
    list_display = ["created_at", "tenant", "actor", "action", "target_type", "target_id"]
    list_filter = ["action"]
    search_fields = ["target_id", "actor", "action"]
    # No date hierarchy: its MIN/MAX and DISTINCT day read the whole log on every page.
    ordering = ["-created_at"]
    show_facets = admin.ShowFacets.NEVER
    readonly_fields = ["tenant", "actor", "action", "target_type", "target_id", "details", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
