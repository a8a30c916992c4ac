"""Admin for notifications, providers, templates and sequences. Staff see only their tenants
(TenantScopedAdmin); recipients appear only masked and provider secrets never appear."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from core.admin_scoping import TenantScopedAdmin, visible_tenant_ids
from core.masking import mask_secret
from notifications import services, templating
from notifications.models import (
    DeliveryAttempt,
    Enrollment,
    Notification,
    Provider,
    Sequence,
    SequenceStep,
    Status,
    Template,
    TenantQueue,
)
from queueing.stats import CappedCountPaginator

MAX_QUEUE_CHOICES = 200


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptInline(ReadOnlyMixin, admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    fields = ["number", "outcome", "started_at", "finished_at", "duration_ms", "http_status", "error_class",
              "error_code", "error_message", "provider"]  # fmt: skip
    readonly_fields = fields
    ordering = ["number"]


class StatusFilter(admin.SimpleListFilter):
    """The stored status, choices from the constants (no DISTINCT over the table). Every status but
    `delivered` is read through notif_console_status_idx / notif_console_tenant_idx; `delivered` (nearly
    every row) through the created_at indexes. `dispatching` is a live lease, not a stored status: those
    notifications read `queued` or `retrying` here, and `dispatching` on their own page."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s.value, s.label) for s in Status if s != Status.DISPATCHING]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(status=self.value()) if self.value() in Status.values else queryset


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

    list_display = ["id", "tenant", "channel", "recipient_masked", "provider", "status", "priority", "queue",
                    "attempt_count", "created_at"]  # fmt: skip
    list_filter = [StatusFilter, "channel", QueueFilter]
    search_fields = ["=id"]  # the search itself is get_search_results
    search_help_text = "Search by notification id."
    list_select_related = ["tenant", "provider"]
    ordering = ["-created_at", "-id"]
    list_per_page = 50  # rendering a row's ten cells costs more than reading it
    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a COUNT per filter choice would scan the table on every page
    # `recipient` (ciphertext at rest, plaintext once decrypted) is deliberately absent.
    fields = ["id", "tenant", "channel", "recipient_masked", "provider", "template", "status_now", "priority",
              "queue", "scheduled_for", "enqueued_at", "delivered_at", "attempt_count", "attempt_offset",
              "last_error_code", "subject", "body", "context", "metadata", "enrollment", "created_at",
              "updated_at"]  # fmt: skip
    readonly_fields = fields
    inlines = [AttemptInline]

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


class ProviderForm(forms.ModelForm):
    class Meta:
        model = Provider
        fields = ["rate_per_second", "burst", "max_attempts"]


@admin.register(Provider)
class ProviderAdmin(TenantScopedAdmin):
    """Operators tune rate limits and attempts here; everything else changes through the API, which
    validates the configuration. Secrets are shown masked only."""

    form = ProviderForm
    list_display = [
        "name", "tenant", "channel", "kind", "is_default", "rate_per_second", "effective_rate", "max_attempts"
    ]  # fmt: skip
    list_filter = ["kind", "channel", "is_default"]
    search_fields = ["name"]
    readonly_fields = ["tenant", "name", "channel", "kind", "config", "masked_secrets", "is_default", "created_at",
                       "updated_at"]  # fmt: skip
    fields = [*readonly_fields[:6], "rate_per_second", "burst", "max_attempts", *readonly_fields[6:]]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).with_effective_rate()

    @admin.display(description="effective rate /s")
    def effective_rate(self, obj: Provider) -> str:
        """The adaptive rate the dispatchers use now (lowered after 429s), when it is limited."""
        rate = getattr(obj, "bucket_rate", None)
        return "—" if rate is None else f"{rate:g}"

    @admin.display(description="secrets")
    def masked_secrets(self, obj: Provider) -> str:
        return ", ".join(f"{k}: {mask_secret(v)}" for k, v in sorted((obj.secrets or {}).items())) or "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        services.save_provider(obj, actor=f"user:{request.user.get_username()}", fields=list(form.changed_data))


class TemplateForm(forms.ModelForm):
    class Meta:
        model = Template
        fields = ["tenant", "key", "channel", "subject", "body"]

    def _checked(self, name: str) -> str:
        text = self.cleaned_data.get(name) or ""
        try:
            templating.check(text)
        except templating.TemplateError as exc:
            raise forms.ValidationError(f"Invalid template: {exc}") from None
        return text

    def clean_subject(self) -> str:
        return self._checked("subject")

    def clean_body(self) -> str:
        return self._checked("body")


@admin.register(Template)
class TemplateAdmin(TenantScopedAdmin):
    form = TemplateForm
    list_display = ["key", "tenant", "channel", "updated_at"]
    list_filter = ["channel"]
    search_fields = ["key"]

    def save_model(self, request: HttpRequest, obj: Template, form: Any, change: bool) -> None:
        fields = list(form.changed_data) if change else None
        services.save_template(obj, actor=f"user:{request.user.get_username()}", fields=fields)


class StepInline(ReadOnlyMixin, admin.TabularInline):
    model = SequenceStep
    extra = 0
    fields = ["position", "offset_seconds", "channel", "template"]
    readonly_fields = fields
    ordering = ["position"]


@admin.register(Sequence)
class SequenceAdmin(TenantScopedAdmin):
    """Only the display name is editable: steps are fixed once enrollments may have used them, and
    deleting a sequence would orphan its enrollments' scheduled steps (they would still be sent)."""

    list_display = ["key", "tenant", "name", "created_at"]
    search_fields = ["key", "name"]
    readonly_fields = ["tenant", "key", "created_at"]
    fields = ["tenant", "key", "name", "created_at"]
    inlines = [StepInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sequences are defined through the API, which validates their steps

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepNotificationInline(LiveStatusMixin, ReadOnlyMixin, admin.TabularInline):
    """An enrollment's steps: one notification each, with its delivery status (recipient masked)."""

    model = Notification
    fk_name = "enrollment"
    extra = 0
    verbose_name = "step"
    verbose_name_plural = "steps"
    fields = ["step", "notification", "channel", "recipient_masked", "status_now", "scheduled_for", "delivered_at",
              "attempt_count", "last_error_code"]  # fmt: skip
    readonly_fields = fields
    ordering = ["scheduled_for"]

    def get_queryset(self, request: HttpRequest) -> Any:
        columns = [f for f in self.fields if f not in ("step", "notification", "status_now")]
        rows = super().get_queryset(request).only(*columns, "id", "status", "metadata", "enrollment_id")
        return rows.with_live_status()

    @admin.display(description="step")
    def step(self, obj: Notification) -> int | None:
        return (obj.metadata or {}).get("step")

    @admin.display(description="notification")
    def notification(self, obj: Notification) -> str:
        url = reverse("admin:notifications_notification_change", args=[obj.pk])
        return format_html('<a href="{}">{}</a>', url, obj.pk)


@admin.register(Enrollment)
class EnrollmentAdmin(ReadOnlyMixin, TenantScopedAdmin):
    """Read-only: remove a recipient through the API (`DELETE sequences/{key}/enrollments/{id}`)."""

    list_display = ["id", "tenant", "sequence", "recipient_masked", "state", "starts_at", "created_at"]
    list_filter = ["state"]
    search_fields = ["=id", "sequence__key"]
    list_select_related = ["tenant", "sequence"]
    # `recipient` (encrypted at rest, clear once decrypted) is deliberately absent.
    fields = ["id", "tenant", "sequence", "recipient_masked", "context", "state", "starts_at", "created_at",
              "cancelled_at"]  # fmt: skip
    readonly_fields = fields
    inlines = [StepNotificationInline]
