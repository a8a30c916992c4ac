"""A notification's receipt events on its console page (masked), oldest first."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.admin_scoping import ReadOnlyMixin
from core.masking import mask_mapping
from notifications.admin import register_notification_inline
from receipts.models import NotificationEvent


class EventInline(ReadOnlyMixin, admin.TabularInline):
    model = NotificationEvent
    fk_name = "notification"
    extra = 0
    verbose_name = "receipt event"
    verbose_name_plural = "receipt events"
    fields = ["occurred_at", "type", "receipt", "bounce_type", "provider", "masked_details", "created_at"]
    readonly_fields = fields
    ordering = ["occurred_at", "id"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("provider")  # notif_event_notification_idx

    @admin.display(description="details")
    def masked_details(self, obj: NotificationEvent) -> str:
        return json.dumps(mask_mapping(obj.details or {}), sort_keys=True)


register_notification_inline(EventInline)
