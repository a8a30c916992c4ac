"""`event-endpoints`: the tenant's event webhook endpoints, addressed by name.

Every queryset starts with for_tenant(): another tenant's endpoint is a 404. Changes go through
events.services, which audits them in their transaction.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.pagination import StrictCursorPagination
from core.api.schema import StrictQueryMixin, errors
from events import services
from events.api.serializers import (
    CreatedEventEndpointSerializer,
    EventAttemptSerializer,
    EventEndpointSerializer,
    RecoverResultSerializer,
    RecoverSerializer,
)
from events.models import EventAttempt, EventEndpoint

SLUG = "[-a-zA-Z0-9_]+"


def _actor(request: Request) -> str:
    return request.user.actor


class AttemptPagination(StrictCursorPagination):
    ordering = ("-attempted_at", "-pk")


@extend_schema_view(
    list=extend_schema(responses={200: EventEndpointSerializer(many=True), **errors(400)}),
    retrieve=extend_schema(responses={200: EventEndpointSerializer, **errors(404)}),
    create=extend_schema(
        responses={201: CreatedEventEndpointSerializer, **errors(400, 409, 413)},
        description="Create an endpoint. Without `secret`, one is generated and returned once, here.",
    ),
    partial_update=extend_schema(responses={200: EventEndpointSerializer, **errors(400, 404, 413)}),
    destroy=extend_schema(responses={204: None, **errors(404)}),
)
class EventEndpointViewSet(StrictQueryMixin, viewsets.ModelViewSet):
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    serializer_class = EventEndpointSerializer
    pagination_class = StrictCursorPagination
    lookup_field = "name"
    lookup_value_regex = SLUG

    def allowed_query_params(self) -> tuple[str, ...]:
        if self.action == "attempts":
            return (AttemptPagination.cursor_query_param, AttemptPagination.page_size_query_param)
        return super().allowed_query_params()

    def get_queryset(self) -> QuerySet[EventEndpoint]:
        if getattr(self, "swagger_fake_view", False):
            return EventEndpoint.objects.none()
        return EventEndpoint.objects.for_tenant(self.request.tenant)

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = EventEndpointSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        endpoint, generated = services.create_endpoint(request.tenant, actor=_actor(request), **body.validated_data)
        data = EventEndpointSerializer(endpoint).data
        if generated is not None:
            data["secret"] = generated
        return Response(data, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        endpoint = self.get_object()
        body = EventEndpointSerializer(endpoint, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        endpoint = services.update_endpoint(endpoint, body.validated_data, actor=_actor(request))
        return Response(EventEndpointSerializer(endpoint).data)

    def perform_destroy(self, instance: EventEndpoint) -> None:
        services.delete_endpoint(instance, actor=_actor(self.request))

    @extend_schema(
        operation_id="event_endpoints_recover",
        request=RecoverSerializer,
        responses={202: RecoverResultSerializer, **errors(400, 404, 409)},
        description="Re-send, with their original webhook-ids, the events since `since` that this endpoint "
        "never received. 409 `endpoint_disabled` while the endpoint is disabled.",
    )
    @action(detail=True, methods=["post"])
    def recover(self, request: Request, name: str) -> Response:
        endpoint = self.get_object()
        body = RecoverSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        queued = services.recover(endpoint, body.validated_data["since"], actor=_actor(request))
        return Response({"queued": queued}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="event_endpoints_attempts",
        request=None,
        responses={200: EventAttemptSerializer(many=True), **errors(400, 404)},
        description="Delivery attempts to this endpoint, newest first, cursor-paginated (`limit` 1–500).",
    )
    @action(detail=True, methods=["get"], pagination_class=AttemptPagination)
    def attempts(self, request: Request, name: str) -> Response:
        endpoint = self.get_object()
        attempts = EventAttempt.objects.for_tenant(request.tenant).filter(endpoint=endpoint)
        page = self.paginate_queryset(attempts)
        return self.get_paginated_response(EventAttemptSerializer(page, many=True).data)
