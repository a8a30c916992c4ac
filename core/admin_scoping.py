"""Admin base classes: superusers see every tenant, other staff only the tenants they belong to
(`TenantScopedAdmin`); read-only pages and inlines (`ReadOnlyMixin`); an action that calls a service
on each selected row (`each_selected`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from rest_framework.exceptions import APIException

from core.models import Tenant


def visible_tenants(request: HttpRequest) -> QuerySet[Tenant]:
    if request.user.is_superuser:
        return Tenant.objects.all()
    return Tenant.objects.filter(memberships__user=request.user)


def visible_tenant_ids(request: HttpRequest) -> list[Any]:
    """A staff member's tenant ids, read once per request. Lists filter on these values rather than
    on a membership subquery, so the planner sees `tenant_id = ?` (one tenant) and walks the tenant-led
    indexes in page order instead of collecting every row of the tenant to sort."""
    cached = getattr(request, "_visible_tenant_ids", None)
    if cached is None:
        cached = list(visible_tenants(request).order_by("pk").values_list("pk", flat=True))
        request._visible_tenant_ids = cached
    return cached


class TenantScopedAdmin(admin.ModelAdmin):
    """For models with a `tenant` field; list, detail, actions and FK choices are all scoped."""

    list_select_related = ("tenant",)
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(tenant_id__in=visible_tenant_ids(request))

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "tenant":
            kwargs["queryset"] = visible_tenants(request)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_list_filter(self, request: HttpRequest) -> Any:
        filters = list(super().get_list_filter(request))
        if request.user.is_superuser and "tenant" not in filters:
            filters.insert(0, "tenant")
        return filters


class DefaultStatusFilter(admin.SimpleListFilter):
    """A status filter that shows one status unless asked otherwise (the one an index serves and an
    operator works on), plus "All". Subclasses set `statuses` (a TextChoices) and `default`."""

    title = "status"
    parameter_name = "status"
    statuses: Any
    default: str

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s.value, s.label) for s in self.statuses] + [("all", "All")]

    def choices(self, changelist: Any) -> Any:
        for lookup, title in self.lookup_choices:
            yield {
                "selected": (self.value() or self.default) == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value() or self.default
        return queryset if value == "all" else queryset.filter(status=value)


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def each_selected(queryset: QuerySet, call: Callable[[Any], object], limit: int = 100) -> tuple[int, int]:
    """`call(pk)` for each of up to `limit` selected rows (a service that re-checks the row's state and
    writes its audit event): (done, refused), refused counting the rows it turned down (APIException)."""
    done, refused = 0, 0
    for pk in queryset.order_by().values_list("pk", flat=True)[:limit]:
        try:
            call(pk)
            done += 1
        except APIException:
            refused += 1
    return done, refused
