"""`templates/{key}`: a tenant's templates, addressed by their key. Scoped with for_tenant(); saving
and deleting go through templating.services."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_view

from core.api.viewsets import ConfigViewSet, actor, config_docs
from templating import services
from templating.api.serializers import TemplateSerializer
from templating.models import Template


@extend_schema_view(**config_docs(TemplateSerializer))
class TemplateViewSet(ConfigViewSet):
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

    def remove(self, instance: Any, *, actor: str) -> None:
        services.delete_template(instance, actor=actor)
