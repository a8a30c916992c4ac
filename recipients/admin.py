"""Recipients in the console: the suppression list (added and removed, never edited), categories,
subscribers, and topics with their members (read-only: the API changes them). Staff see only their
tenants' (TenantScopedAdmin); addresses appear only masked. A topic shows its stored member count,
and its members list by the page with a capped count: no page counts a topic's millions."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from core.admin_scoping import ReadOnlyMixin, TenantScopedAdmin
from core.channels import Channel
from core.validation import FieldErrors, check_recipient
from queueing.stats import CappedCountPaginator
from recipients import services, suppressions
from recipients.models import Category, Device, Subscriber, Suppression, SuppressionReason, Topic, TopicSubscriber


class SuppressionForm(forms.ModelForm):
    """Adding an entry: the address is typed once, stored encrypted and shown masked afterwards."""

    address = forms.CharField(max_length=4096, help_text="Emails match case-insensitively; phones in E.164.")

    class Meta:
        model = Suppression
        fields = ["tenant", "channel", "reason", "category"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        channel, address = data.get("channel"), data.get("address")
        if channel and address:
            try:
                data["address"] = check_recipient(suppressions.normalise(channel, address), channel)
            except ValueError as exc:
                self.add_error("address", str(exc))
            if data.get("reason") in suppressions.ADDRESS_REASONS and channel not in suppressions.ADDRESS_CHANNELS:
                self.add_error("reason", "hard bounces and complaints suppress email and sms addresses only")
        return data


@admin.register(Suppression)
class SuppressionAdmin(TenantScopedAdmin):
    """The suppression list: added and removed here (audited, through recipients.suppressions),
    never edited. Search takes an exact address and finds it by its blind index."""

    list_display = ["recipient_masked", "tenant", "channel", "reason", "category", "source_notification_id",
                    "created_at"]  # fmt: skip
    list_filter = ["channel", "reason"]
    search_fields = ["=recipient_index"]  # the search itself is get_search_results
    search_help_text = "An exact address (email, phone or token)."
    ordering = ["-created_at", "-id"]
    readonly_fields = ["id", "tenant", "channel", "recipient_masked", "reason", "category", "source_notification_id",
                       "created_at"]  # fmt: skip

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = SuppressionForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return ["tenant", "channel", "address", "reason", "category"]
        return list(self.readonly_fields)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return list(self.readonly_fields) if obj is not None else []

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        return {"reason": SuppressionReason.MANUAL}

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> tuple[Any, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        found = {index for channel in Channel.values for index in suppressions.indexes(channel, term)}
        return queryset.filter(recipient_index__in=sorted(found)), False

    def save_model(self, request: HttpRequest, obj: Suppression, form: Any, change: bool) -> None:
        data = form.cleaned_data
        entry, _ = suppressions.suppress(
            data["tenant"].pk, data["channel"], data["address"], data["reason"], data.get("category") or None,
            actor=f"user:{request.user.get_username()}",
        )  # fmt: skip
        form.instance = entry
        obj.pk, obj.recipient_masked, obj.created_at = entry.pk, entry.recipient_masked, entry.created_at

    def delete_model(self, request: HttpRequest, obj: Suppression) -> None:
        suppressions.remove(obj.tenant_id, obj.pk, actor=f"user:{request.user.get_username()}")

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for tenant_id, pk in queryset.values_list("tenant_id", "pk"):
            suppressions.remove(tenant_id, pk, actor=f"user:{request.user.get_username()}")


class CategoryForm(forms.ModelForm):
    class Meta:
        model = Category
        fields = ["tenant", "key", "critical", "description", "quiet_hours"]
        help_texts = {"quiet_hours": '{"start": "22:00", "end": "07:00"} in the recipient\'s time zone (end '
                                     'exclusive); {"start": "00:00", "end": "00:00"}: none; empty: general\'s.'}

    def clean_quiet_hours(self) -> dict[str, str] | None:
        try:
            return services.check_quiet_hours(self.cleaned_data.get("quiet_hours"))
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(Category)
class CategoryAdmin(TenantScopedAdmin):
    """Categories of a tenant's notifications; saves go through recipients.services (audited)."""

    form = CategoryForm
    list_display = ["key", "tenant", "critical", "quiet", "description"]
    list_filter = ["critical"]
    search_fields = ["key"]
    fields = ["tenant", "key", "critical", "description", "quiet_hours"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["tenant", "key"] if obj is not None else []

    @admin.display(description="quiet hours")
    def quiet(self, obj: Category) -> str:
        return services.describe_quiet_hours(obj.quiet_hours)

    def save_model(self, request: HttpRequest, obj: Category, form: Any, change: bool) -> None:
        fields = list(form.changed_data) if change else None
        try:
            services.save_category(obj, actor=f"user:{request.user.get_username()}", fields=fields)
        except FieldErrors as exc:
            self.message_user(request, "; ".join(m for ms in exc.errors.values() for m in ms), level="error")

    def delete_model(self, request: HttpRequest, obj: Category) -> None:
        services.delete_category(obj, actor=f"user:{request.user.get_username()}")

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for category in queryset.exclude(key="general"):
            services.delete_category(category, actor=f"user:{request.user.get_username()}")


class DeviceInline(admin.TabularInline):
    """The subscriber's push devices, masked only (`token` is ciphertext at rest and never shown)."""

    model = Device
    fields = ["kind", "token_masked", "active", "deactivated_reason", "created_at", "last_used_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["-created_at"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).defer("token")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Subscriber)
class SubscriberAdmin(ReadOnlyMixin, TenantScopedAdmin):
    """Subscribers, addresses masked only; they change through the API (PUT subscribers/{external_id})."""

    list_display = ["external_id", "tenant", "email_masked", "phone_masked", "timezone", "created_at"]
    search_fields = ["=external_id"]
    ordering = ["-created_at", "-id"]
    # `email`, `phone` and `push_tokens` (ciphertext at rest, plaintext once decrypted) are deliberately absent.
    fields = ["external_id", "tenant", "email_masked", "phone_masked", "push_tokens_masked", "timezone", "locale",
              "preferences", "created_at", "updated_at"]  # fmt: skip
    readonly_fields = fields
    inlines = [DeviceInline]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).defer("email", "phone", "push_tokens")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return TenantScopedAdmin.has_delete_permission(self, request, obj)

    def delete_model(self, request: HttpRequest, obj: Subscriber) -> None:
        services.delete_subscriber(obj.tenant, obj.external_id, actor=f"user:{request.user.get_username()}")

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for subscriber in queryset.select_related("tenant"):
            self.delete_model(request, subscriber)


@admin.register(Topic)
class TopicAdmin(ReadOnlyMixin, TenantScopedAdmin):
    """Topics, with `subscriber_count` (the counter the membership statements keep, never a count of
    the members) and a link to their members. A deleted topic shows as `deleting` while the scheduler
    deletes its members (the count falls as they go), then disappears."""

    list_display = ["key", "name", "tenant", "members", "state", "created_at"]
    search_fields = ["=key"]
    ordering = ["-created_at", "-id"]
    paginator = CappedCountPaginator
    fields = readonly_fields = ["key", "name", "tenant", "members", "state", "active_fanouts", "created_at",
                                "updated_at", "deleted_at"]  # fmt: skip

    @admin.display(description="members", ordering="subscriber_count")
    def members(self, obj: Topic) -> Any:  # noqa: ANN401
        url = reverse("admin:recipients_topicsubscriber_changelist")
        return format_html('<a href="{}?topic__id__exact={}">{}</a>', url, obj.pk, f"{obj.subscriber_count:,}")

    @admin.display(description="state")
    def state(self, obj: Topic) -> str:
        return "live" if obj.deleted_at is None else "deleting"


@admin.register(TopicSubscriber)
class TopicSubscriberAdmin(ReadOnlyMixin, TenantScopedAdmin):
    """A topic's members (open from the topic's member count), newest first by the page on the index
    (topic, id); the page count is exact to CappedCountPaginator.cap, then the planner's estimate. A
    member is its subscriber's external id: no address is read."""

    list_display = ["subscriber", "topic", "tenant", "added_at", "removed"]
    list_select_related = ("tenant", "topic")
    search_fields = ["=subscriber"]
    ordering = ["-id"]
    paginator = CappedCountPaginator
    raw_id_fields = ["topic"]
    fields = readonly_fields = ["subscriber", "topic", "tenant", "added_at", "removed"]

    @admin.display(description="removed", boolean=True)
    def removed(self, obj: TopicSubscriber) -> bool:
        """Removed while a fan-out of the topic runs: kept until it ends, so the fan-out still reaches it."""
        return obj.removed_seq is not None
