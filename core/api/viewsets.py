"""What every room's API views share: who acts (`actor`), ids from the path (`as_uuid`), the
per-action OpenAPI responses of a configuration object (`config_docs`), and the viewset of a
tenant's configuration objects addressed by the name the tenant gave them (`ConfigViewSet`)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import Model, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request

from core.api.pagination import StrictCursorPagination
from core.api.schema import StrictQueryMixin, errors

SLUG = "[-a-zA-Z0-9_]+"


def actor(request: Request) -> str:
    return request.user.actor


def as_uuid(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise NotFound() from None


def config_docs(serializer: type[serializers.Serializer]) -> dict[str, Any]:
    """Per-action schemas: the serializer on success, the shared error shape otherwise."""
    return {
        "list": extend_schema(responses={200: serializer(many=True), **errors(400)}),
        "retrieve": extend_schema(responses={200: serializer, **errors(404)}),
        "create": extend_schema(responses={201: serializer, **errors(400, 409, 413)}),
        "partial_update": extend_schema(responses={200: serializer, **errors(400, 404, 409, 413)}),
        "destroy": extend_schema(responses={204: None, **errors(404, 409)}),
    }


# A tenant's objects of `model`, scoped with for_tenant(); saving and deleting go through the room's
# services (`perform_*`, `remove`). (A comment, not a docstring: drf-spectacular would copy a docstring
# into every operation's description.)
class ConfigViewSet(StrictQueryMixin, viewsets.ModelViewSet):
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    pagination_class = StrictCursorPagination
    lookup_value_regex = SLUG
    model: type[Model]

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):
            return self.model.objects.none()
        return self.model.objects.for_tenant(self.request.tenant)

    def perform_destroy(self, instance: Any) -> None:
        self.remove(instance, actor=actor(self.request))

    def remove(self, instance: Any, *, actor: str) -> None:
        raise NotImplementedError
