"""`providers/{name}`: a tenant's providers, addressed by the name the tenant gave them. Scoped with
for_tenant(); saving and deleting go through providers.services."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema_view

from core.api.viewsets import ConfigViewSet, actor, config_docs
from providers import services
from providers.api.serializers import ProviderSerializer
from providers.models import Provider


@extend_schema_view(**config_docs(ProviderSerializer))
class ProviderViewSet(ConfigViewSet):
    serializer_class = ProviderSerializer
    lookup_field = "name"
    model = Provider

    def get_queryset(self) -> QuerySet[Provider]:
        return super().get_queryset().as_shown()

    def perform_create(self, serializer: ProviderSerializer) -> None:
        provider = Provider(tenant=self.request.tenant, **serializer.validated_data)
        serializer.instance = services.save_provider(provider, actor=actor(self.request))

    def perform_update(self, serializer: ProviderSerializer) -> None:
        provider = serializer.instance
        for name, value in serializer.validated_data.items():
            setattr(provider, name, value)
        services.save_provider(provider, actor=actor(self.request), fields=list(serializer.validated_data))

    def remove(self, instance: Any, *, actor: str) -> None:
        services.delete_provider(instance, actor=actor)
