"""The dead-letter queue in the console: list with filters and search, a detail page with the whole
attempt timeline, and redrive / discard (bulk actions and buttons on the detail page).

Every change goes through dlq.services, which re-checks each entry's state inside its own
transaction and writes the audit event in it; the actions need `dlq.redrive_deadletter`.
Pages stay cheap with a million rows: open entries by default (dlq_status_recent_idx), every
status through dlq_console_recent_idx, a capped count instead of COUNT(*), tenant and provider
joined, the notifications' statuses read for the page by primary key, and only the masked
recipient is ever read.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import F, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html

from core.admin_scoping import DefaultStatusFilter, TenantScopedAdmin, visible_tenant_ids
from core.masking import mask_text
from dlq import services
from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt, Notification
from providers.models import Provider
from queueing.stats import CappedCountPaginator

# Bigger selections belong to `manage.py dlq_redrive --rate`, which paces them.
MAX_ACTION_ENTRIES = 1000


def actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


class StatusFilter(DefaultStatusFilter):
    """Open entries by default (what an operator works on; served by the (status, created_at) indexes)."""

    statuses = DeadLetter.Status
    default = DeadLetter.Status.OPEN


class ProviderFilter(admin.SimpleListFilter):
    """By provider name, offering only the providers of the tenants this user may see (one query)."""

    title = "provider"
    parameter_name = "provider"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        providers = Provider.objects.all()
        if not request.user.is_superuser:
            providers = providers.filter(tenant_id__in=visible_tenant_ids(request))
        names = providers.order_by("name").values_list("name", flat=True).distinct()
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(provider__name=self.value()) if self.value() else queryset


_BADGE = {
    "open": "#ba2121", "redriven": "#417690", "discarded": "#777",
    "delivered": "#2e8540", "failed": "#ba2121", "dead_lettered": "#ba2121", "retrying": "#b7791f",
    "queued": "#417690", "dispatching": "#417690", "cancelled": "#777",
}  # fmt: skip


def badge(value: str) -> str:
    colour = _BADGE.get(value, "#777")
    return format_html(
        '<span class="dlq-badge" data-value="{}" style="background:{};color:#fff;border-radius:9px;'
        'padding:1px 8px;font-size:11px;font-weight:600;white-space:nowrap">{}</span>',
        value, colour, value.replace("_", " "),
    )  # fmt: skip


def attempt_shade(outcome: str, *, last: bool, note: dict[str, Any] | None) -> str:
    """What an attempt led to: a transient error was followed by a retry, except the notification's
    last attempt when no retry came (attempts exhausted: dead-lettered; or failed, cancelled)."""
    if outcome == "delivered":
        return "delivered"
    if outcome != "transient_error":
        return "failed"
    if last and note is not None and note["status"] in ("dead_lettered", "failed", "cancelled"):
        return note["status"]
    return "retrying"


class DeadLetterChangeList(ChangeList):
    """The page's notification statuses in one query by primary key once the page is cut: joined into the
    list's query, notifications would be joined into its count too (a hash join over every notification)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        entries = list(self.result_list)
        ids = {e.notification_id for e in entries}
        statuses = dict(Notification.objects.filter(pk__in=ids).values_list("pk", "status")) if ids else {}
        for entry in entries:
            entry.notification_status = statuses.get(entry.notification_id, "")
        self.result_list = entries


@admin.register(DeadLetter)
class DeadLetterAdmin(TenantScopedAdmin):
    # Eight columns that fit beside the filters at 1280 px (the class and error code share one, as do the
    # entry's state and the notification's); `change_list.html` lets long codes and names wrap.
    list_display = [
        "opened", "tenant", "notification_id_short", "provider_name", "failure", "tries", "state", "resolved",
    ]  # fmt: skip
    list_display_links = ["opened"]
    list_filter = [StatusFilter, "failure_class", ProviderFilter, ("created_at", admin.DateFieldListFilter)]
    list_select_related = ("tenant", "provider")
    list_per_page = 50
    search_fields = ["notification__id"]  # the search itself is get_search_results
    search_help_text = "Search by notification id (or entry id)."
    ordering = ["-created_at", "-id"]
    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a COUNT per filter choice would scan the table on every page
    actions = ["redrive_selected", "discard_selected"]
    fieldsets = [
        (None, {"fields": ["entry_status", "failure_class", "error_code", "last_status_code", "attempt_count",
                           "reason"]}),  # fmt: skip
        ("Resolution", {"fields": ["created_at", "resolved_at", "resolved_by"]}),
        ("Routing", {"fields": ["tenant", "notification_id", "provider"]}),
    ]
    readonly_fields = [
        "entry_status", "failure_class", "error_code", "last_status_code", "attempt_count", "reason", "created_at",
        "resolved_at", "resolved_by", "tenant", "notification_id", "provider",
    ]  # fmt: skip
    change_form_template = "admin/dlq/deadletter/change_form.html"
    change_list_template = "admin/dlq/deadletter/change_list.html"

    # --- permissions: read-only rows; changes only through redrive / discard -----------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("dlq.redrive_deadletter")

    # --- queries ------------------------------------------------------------------------------------
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DeadLetterChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        cache = request.__dict__.setdefault("_dlq_objects", {})
        if object_id not in cache:
            qs = self.get_queryset(request).select_related("tenant", "provider")
            qs = qs.annotate(notification_status=F("notification__status"))
            try:
                cache[object_id] = qs.get(pk=uuid.UUID(str(object_id)))
            except (ValueError, DeadLetter.DoesNotExist):
                cache[object_id] = None
        return cache[object_id]

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            value = uuid.UUID(term)
        except ValueError:
            return queryset.none(), False
        return queryset.filter(notification_id=value) | queryset.filter(pk=value), False

    # --- columns ------------------------------------------------------------------------------------
    def get_list_display(self, request: HttpRequest) -> list[str]:
        """The tenant column only for those who see more than one tenant."""
        columns = list(super().get_list_display(request))
        if not request.user.is_superuser and len(visible_tenant_ids(request)) < 2:
            columns.remove("tenant")
        return columns

    @admin.display(description="opened (UTC)", ordering="created_at")
    def opened(self, entry: DeadLetter) -> str:
        return f"{entry.created_at:%Y-%m-%d %H:%M:%S}"

    @admin.display(description="failure", ordering="failure_class")
    def failure(self, entry: DeadLetter) -> str:
        return format_html('{}<br><span class="dlq-code">{}</span>', entry.failure_class, entry.error_code or "—")

    @admin.display(description="entry · now", ordering="status")
    def state(self, entry: DeadLetter) -> str:
        """The entry's state, and the notification's status now (delivered once a redrive went through)."""
        now = badge(entry.notification_status)
        return format_html('<span class="dlq-state">{} {}</span>', badge(entry.status), now)

    @admin.display(description="tries", ordering="attempt_count")
    def tries(self, entry: DeadLetter) -> int:
        return entry.attempt_count

    @admin.display(description="notification", ordering="notification_id")
    def notification_id_short(self, entry: DeadLetter) -> str:
        short = str(entry.notification_id)[:8]
        return format_html('<code title="{}">{}…</code>', entry.notification_id, short)

    @admin.display(description="error", ordering="error_code")
    def error(self, entry: DeadLetter) -> str:
        return entry.error_code or "—"

    @admin.display(description="provider", ordering="provider__name")
    def provider_name(self, entry: DeadLetter) -> str:
        return entry.provider.name if entry.provider_id is not None else "—"

    @admin.display(description="entry", ordering="status")
    def entry_status(self, entry: DeadLetter) -> str:
        return badge(entry.status)

    @admin.display(description="now")
    def notification_status_badge(self, entry: DeadLetter) -> str:
        return badge(entry.notification_status)

    @admin.display(description="resolved")
    def resolved(self, entry: DeadLetter) -> str:
        if entry.resolved_at is None:
            return "—"
        return format_html("{}<br><small>{}</small>", entry.resolved_by, f"{entry.resolved_at:%Y-%m-%d %H:%M}")

    @admin.display(description="failure reason")
    def reason(self, entry: DeadLetter) -> str:
        return mask_text(entry.failure_reason)

    # --- bulk actions -------------------------------------------------------------------------------
    def _selected_ids(self, request: HttpRequest, queryset: QuerySet) -> list[uuid.UUID] | None:
        ids = list(queryset.order_by().values_list("pk", flat=True)[: MAX_ACTION_ENTRIES + 1])
        if len(ids) > MAX_ACTION_ENTRIES:
            self.message_user(
                request,
                f"More than {MAX_ACTION_ENTRIES:,} entries selected; nothing was changed. For bulk work use "
                "`manage.py dlq_redrive --rate …` (paced, with a progress bar) or POST /api/v1/dlq/redrive.",
                messages.ERROR,
            )
            return None
        return ids

    def _report(self, request: HttpRequest, verb: str, done: int, refused: dict[Any, str]) -> None:
        if done:
            self.message_user(request, f"{verb} {done} entr{'y' if done == 1 else 'ies'}.", messages.SUCCESS)
        if refused:
            why = "; ".join(f"{n} — {services.REASONS[code]}" for code, n in Counter(refused.values()).most_common())
            self.message_user(request, f"{len(refused)} not {verb.lower()}: {why}.", messages.WARNING)
        if not done and not refused:
            self.message_user(request, "No entries selected.", messages.WARNING)

    @admin.action(description="Redrive selected entries (re-queue, fresh attempt budget)", permissions=["redrive"])
    def redrive_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        ids = self._selected_ids(request, queryset)
        if ids is not None:
            result = services.redrive(ids, actor=actor(request))
            self._report(request, "Redriven", len(result.redriven), result.refused)

    @admin.action(description="Discard selected entries (close without sending)", permissions=["redrive"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        ids = self._selected_ids(request, queryset)
        if ids is not None:
            result = services.discard(ids, actor=actor(request))
            self._report(request, "Discarded", len(result.discarded), result.refused)

    # --- detail page: timeline and single-entry buttons ----------------------------------------------
    def get_urls(self) -> list:
        info = self.opts.app_label, self.opts.model_name
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/redrive/", view(self.redrive_view), name="{}_{}_redrive".format(*info)),
            path("<path:object_id>/discard/", view(self.discard_view), name="{}_{}_discard".format(*info)),
            *super().get_urls(),
        ]

    def _single(self, request: HttpRequest, object_id: str, *, redrive: bool) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_redrive_permission(request):
            raise PermissionDenied
        entry = self.get_object(request, unquote(object_id))  # scoped to the user's tenants
        if entry is None:
            raise Http404("No such dead-letter entry.")
        if redrive:
            result = services.redrive([entry.pk], actor=actor(request))
            self._report(request, "Redriven", len(result.redriven), result.refused)
        else:
            outcome = services.discard([entry.pk], actor=actor(request))
            self._report(request, "Discarded", len(outcome.discarded), outcome.refused)
        return redirect(reverse("admin:dlq_deadletter_change", args=[entry.pk]))

    def redrive_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._single(request, object_id, redrive=True)

    def discard_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._single(request, object_id, redrive=False)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        entry = self.get_object(request, unquote(object_id))
        context = dict(extra_context or {})
        if entry is not None:
            context.update(self._timeline_context(request, entry))
        return super().change_view(request, object_id, form_url, context)

    def _timeline_context(self, request: HttpRequest, entry: DeadLetter) -> dict[str, Any]:
        """Three queries whatever the history: the notification (masked fields only), its attempts,
        and its dead-letter entries over time."""
        note = (
            Notification.objects.filter(pk=entry.notification_id)
            .values("id", "status", "channel", "recipient_masked", "attempt_count", "attempt_offset", "queue",
                    "priority", "created_at", "delivered_at", "last_error_code")  # fmt: skip
            .first()
        )
        attempts = list(
            DeliveryAttempt.objects.filter(notification_id=entry.notification_id)
            .order_by("number")
            .values("number", "started_at", "finished_at", "outcome", "error_class", "error_code", "http_status",
                    "duration_ms", "error_message")  # fmt: skip
        )
        previous = None
        offset = note["attempt_offset"] if note else 0
        for i, a in enumerate(attempts):
            a["first_after_redrive"] = bool(offset) and a["number"] == offset + 1
            a["error_message"] = mask_text(a["error_message"])
            a["outcome_badge"] = badge(attempt_shade(a["outcome"], last=i == len(attempts) - 1, note=note))
            a["waited"] = (a["started_at"] - previous).total_seconds() if previous else None
            previous = a["finished_at"]
        history = list(
            DeadLetter.objects.filter(notification_id=entry.notification_id)
            .order_by("created_at")
            .values("id", "created_at", "status", "failure_class", "error_code", "attempt_count", "resolved_by",
                    "resolved_at")  # fmt: skip
        )
        try:
            notification_url = reverse("admin:notifications_notification_change", args=[entry.notification_id])
        except NoReverseMatch:  # the notifications admin is not installed
            notification_url = ""
        return {
            "notification": note,
            "notification_url": notification_url,
            "notification_badge": badge(note["status"]) if note else "",
            "attempts": attempts,
            "history": history,
            "can_act": self.has_redrive_permission(request) and entry.status == DeadLetter.Status.OPEN,
            "redrivable": note is not None and note["status"] in services.REDRIVABLE,
            "audit_url": reverse("admin:core_auditevent_changelist") + f"?q={entry.pk}",
        }
