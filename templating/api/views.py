"""`templates/{key}`: a tenant's templates, addressed by their key; `templates/{key}/versions[/{n}]`
(read-only history) and `templates/{key}/preview`. Scoped with for_tenant(); saving and deleting go
through templating.services, a preview through templating.rendering (the code a send renders with)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.pagination import StrictCursorPagination
from core.api.schema import errors
from core.api.viewsets import ConfigViewSet, actor, config_docs
from templating import rendering, services
from templating.api.serializers import (
    PreviewResultSerializer,
    PreviewSerializer,
    TemplateSerializer,
    TemplateVersionSerializer,
)
from templating.models import Template, TemplateVersion


class VersionPagination(StrictCursorPagination):
    ordering = ("-version",)


@extend_schema_view(
    **config_docs(TemplateSerializer),
    versions=extend_schema(
        description="Every version of the template, newest first; each change makes the next.",
        responses={200: TemplateVersionSerializer(many=True), **errors(404)},
    ),
    version=extend_schema(
        description="One version of the template.", responses={200: TemplateVersionSerializer, **errors(404)}
    ),
    preview=extend_schema(
        description="Render the current version on `context` (and `locale`'s variant, by the same fallback as a "
        "send) as a send would, in the same sandbox and budget; nothing is sent. `400` with the rendering error.",
        request=PreviewSerializer,
        responses={200: PreviewResultSerializer, **errors(400, 404)},
    ),
)
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

    def _versions(self, key: str) -> Any:
        template = self.get_object()
        return TemplateVersion.objects.for_tenant(self.request.tenant).filter(template=template)

    def allowed_query_params(self) -> tuple[str, ...]:
        allowed = super().allowed_query_params()
        if getattr(self, "action", None) == "versions":
            allowed = (*allowed, VersionPagination.cursor_query_param, VersionPagination.page_size_query_param)
        return allowed

    @action(detail=True, methods=["get"], pagination_class=VersionPagination)
    def versions(self, request: Request, key: str) -> Response:
        page = self.paginate_queryset(self._versions(key))
        return self.get_paginated_response(TemplateVersionSerializer(page, many=True).data)

    @action(detail=True, methods=["get"], url_path=r"versions/(?P<n>[0-9]{1,9})")
    def version(self, request: Request, key: str, n: str) -> Response:
        row = self._versions(key).filter(version=int(n)).first()
        if row is None:
            raise NotFound(f"No version {int(n)} of this template.")
        return Response(TemplateVersionSerializer(row).data)

    @action(detail=True, methods=["post"])
    def preview(self, request: Request, key: str) -> Response:
        template = self.get_object()
        body = PreviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        rendered, problems = rendering.render(
            template, data["context"], locales=(data.get("locale"),), html=template.channel == "email"
        )
        if problems:
            raise ValidationError({"template": [f"{part}: {message}" for part, message in problems.items()]})
        return Response({"subject": rendered.subject, "body": rendered.body, "html_body": rendered.html_body,
                         "locale": rendered.locale, "version": rendered.version})  # fmt: skip
