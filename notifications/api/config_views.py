"""Providers, addressed by the name the tenant gave them (`providers/{name}`). Scoped with
for_tenant(); saving and deleting go through notifications.services."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema_view

from core.api.viewsets import ConfigViewSet, actor, config_docs
from notifications import services
from notifications.api.config_serializers import ProviderSerializer
from notifications.models import Provider


@extend_schema_view(**config_docs(ProviderSerializer))
class ProviderViewSet(ConfigViewSet):
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

    def remove(self, instance: Any, *, actor: str) -> None:
        services.delete_provider(instance, actor=actor)
