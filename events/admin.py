"""Event endpoints in the admin: list and change (enabled only; the rest through the API, which
validates it), the secret masked, and the endpoint's recent attempts read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html_join

from core.admin_scoping import TenantScopedAdmin
from core.masking import mask_secret
from events import services
from events.models import EventAttempt, EventEndpoint, public_event_id

RECENT_ATTEMPTS = 50


@admin.register(EventEndpoint)
class EventEndpointAdmin(TenantScopedAdmin):
    list_display = ["name", "tenant", "url", "enabled", "disabled_reason", "failing_since", "updated_at"]
    list_filter = ["enabled"]
    search_fields = ["name"]
    readonly_fields = [
        "tenant", "name", "url", "event_types", "masked_secret", "disabled_reason", "failing_since", "created_at",
        "updated_at", "recent_attempts",
    ]  # fmt: skip
    fields = [*readonly_fields[:5], "enabled", *readonly_fields[5:]]

    @admin.display(description="secret")
    def masked_secret(self, obj: EventEndpoint) -> str:
        return mask_secret(obj.secret)

    @admin.display(description=f"last {RECENT_ATTEMPTS} attempts")
    def recent_attempts(self, obj: EventEndpoint) -> str:
        rows = EventAttempt.objects.for_tenant(obj.tenant_id).filter(endpoint=obj).order_by("-attempted_at", "-pk")
        rows = rows[:RECENT_ATTEMPTS]
        return format_html_join(
            "\n", "<div>{} · {} · {} · HTTP {} · {} ms · {}</div>",
            ((a.attempted_at.isoformat(), public_event_id(a.event_id), a.event_type, a.http_status or "—",
              a.duration_ms, a.status) for a in rows),
        ) or "—"  # fmt: skip

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: EventEndpoint, form: Any, change: bool) -> None:
        changes = {name: form.cleaned_data[name] for name in form.changed_data if name == "enabled"}
        services.update_endpoint(obj, changes, actor=f"user:{request.user.get_username()}")

    def delete_model(self, request: HttpRequest, obj: EventEndpoint) -> None:
        services.delete_endpoint(obj, actor=f"user:{request.user.get_username()}")
