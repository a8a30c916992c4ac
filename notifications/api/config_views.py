"""Providers and templates, addressed by the name the tenant gave them (`providers/{name}`,
`templates/{key}`). Scoped with for_tenant(); saving and deleting go through notifications.services."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, viewsets

from core.api.pagination import StrictCursorPagination
from core.api.schema import StrictQueryMixin, errors
from notifications import services
from notifications.api.config_serializers import ProviderSerializer, TemplateSerializer
from notifications.api.views import actor
from notifications.models import Provider, Template

SLUG = "[-a-zA-Z0-9_]+"

def docs(serializer: type[serializers.Serializer]) -> dict[str, Any]:
    """Per-action schemas: the serializer on success, the shared error shape otherwise."""
    return {
        "list": extend_schema(responses={200: serializer(many=True), **errors(400)}),
        "retrieve": extend_schema(responses={200: serializer, **errors(404)}),
        "create": extend_schema(responses={201: serializer, **errors(400, 409, 413)}),
        "partial_update": extend_schema(responses={200: serializer, **errors(400, 404, 409, 413)}),
        "destroy": extend_schema(responses={204: None, **errors(404, 409)}),
    }


class _ConfigViewSet(StrictQueryMixin, viewsets.ModelViewSet):
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    pagination_class = StrictCursorPagination
    lookup_value_regex = SLUG
    model: type[Provider] | type[Template]

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):
            return self.model.objects.none()
        return self.model.objects.for_tenant(self.request.tenant)

    def perform_destroy(self, instance: Any) -> None:
        services.delete_config(instance, actor=actor(self.request))


@extend_schema_view(**docs(ProviderSerializer))
class ProviderViewSet(_ConfigViewSet):
    serializer_class = ProviderSerializer
    lookup_field = "name"
    model = Provider

    def get_queryset(self) -> QuerySet[Provider]:
        return super().get_queryset().with_effective_rate().with_circuit_state()

    def perform_create(self, serializer: ProviderSerializer) -> None:
        provider = Provider(tenant=self.request.tenant, **serializer.validated_data)
        serializer.instance = services.save_provider(provider, actor=actor(self.request))

    def perform_update(self, serializer: ProviderSerializer) -> None:
        provider = serializer.instance
        for name, value in serializer.validated_data.items():
            setattr(provider, name, value)
        services.save_provider(provider, actor=actor(self.request), fields=list(serializer.validated_data))


@extend_schema_view(**docs(TemplateSerializer))
class TemplateViewSet(_ConfigViewSet):
    serializer_class = TemplateSerializer
    lookup_field = "key"
    model = Template

    def perform_create(self, serializer: TemplateSerializer) -> None:
        template = Template(tenant=self.request.tenant, **serializer.validated_data)
        serializer.instance = services.save_template(template, actor=actor(self.request))

    def perform_update(self, serializer: TemplateSerializer) -> None:
        template = serializer.instance
        for name, value in serializer.validated_data.items():
            setattr(template, name, value)
        services.save_template(template, actor=actor(self.request), fields=list(serializer.validated_data))
