"""`bulk-sends` (upload, list), `bulk-sends/{id}` (with progress), `bulk-sends/{id}/start`,
`bulk-sends/{id}/cancel` and `bulk-sends/{id}/notifications`. Scoped with for_tenant(): another
tenant's bulk send is a 404. Everything that changes data goes through bulk.services."""

from __future__ import annotations

import io
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from bulk import services
from bulk.api.serializers import BulkSendSerializer, BulkUploadSerializer, bulk_data
from bulk.models import BulkSend
from core.api.pagination import StrictCursorPagination
from core.api.parsers import StrictJSONParser
from core.api.schema import StrictQueryMixin, errors
from core.api.viewsets import actor
from notifications.api.serializers import NotificationSerializer, notification_data


class RowCursorPagination(StrictCursorPagination):
    ordering = ("bulk_row",)


@extend_schema_view(
    list=extend_schema(
        description="The tenant's bulk sends, newest first.",
        responses={200: BulkSendSerializer(many=True), **errors(400)},
    ),  # fmt: skip
    retrieve=extend_schema(
        description="One bulk send with its progress.", responses={200: BulkSendSerializer, **errors(404)}
    ),  # fmt: skip
    create=extend_schema(
        description='Upload a CSV file (`multipart/form-data` with `file`, or JSON `{"csv": "<text>"}`; at most '
        "100,000 rows and 20 MiB) with `channel` and `template`, or `workflow`, optional `scheduled_for` and `name`. "
        "The header names `recipient` or `subscriber` and the template's variables; through a workflow, `subscriber` "
        "(one run each, once per subscriber) and any columns, the run's data. Every row is checked: `201` with status "
        "`ready`, or `invalid` with the first 100 errors `{row, column, message}`.",
        request={"application/json": BulkUploadSerializer, "multipart/form-data": BulkUploadSerializer},
        responses={201: BulkSendSerializer, **errors(400, 413)},
    ),  # fmt: skip
)
class BulkSendViewSet(StrictQueryMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = BulkSendSerializer
    pagination_class = StrictCursorPagination
    parser_classes = [StrictJSONParser, MultiPartParser]
    lookup_value_regex = "[^/]+"

    def allowed_query_params(self) -> tuple[str, ...]:
        allowed = super().allowed_query_params()
        if self.action == "notifications":
            allowed = (*allowed, "cursor", "limit")
        return allowed

    def get_queryset(self) -> QuerySet[BulkSend]:
        if getattr(self, "swagger_fake_view", False):
            return BulkSend.objects.none()
        return services.bulk_sends_for(self.request.tenant)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response([bulk_data(b) for b in page])

    def retrieve(self, request: Request, pk: str) -> Response:
        bulk = services.get_bulk_send(request.tenant, pk)
        return Response(bulk_data(bulk, with_progress=True))

    def create(self, request: Request) -> Response:
        data = request.data
        options = services.clean_options(request.tenant, data)
        upload = request.FILES.get("file")
        if upload is not None:
            services.check_size(upload.size)
            lines = io.TextIOWrapper(upload.open("rb"), encoding="utf-8-sig", newline="")
        else:
            text = data.get("csv")
            if not isinstance(text, str):
                raise ValidationError(
                    {"file": ["give the CSV as a `file` (multipart/form-data) or as JSON `csv` text"]}
                )
            services.check_size(len(text.encode()))
            lines = io.StringIO(text.removeprefix("\ufeff"), newline="")
        bulk = services.create_bulk_send(request.tenant, lines, options, actor=actor(request))
        return Response(bulk_data(bulk), status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None,
        responses={202: BulkSendSerializer, **errors(400, 404, 409)},
        description="Send a `ready` bulk send (from its `scheduled_for`, if any); `409` otherwise.",
    )
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str) -> Response:
        bulk = services.start(request.tenant, pk, actor=actor(request))
        return Response(bulk_data(bulk, with_progress=True), status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={200: BulkSendSerializer, **errors(400, 404, 409)},
        description="Stop a ready or sending bulk send: rows without a notification yet never get one.",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        bulk = services.cancel(request.tenant, pk, actor=actor(request))
        return Response(bulk_data(bulk, with_progress=True), status=status.HTTP_200_OK)

    @extend_schema(
        description="The bulk send's notifications, by row (none through a workflow: its runs are "
        "`GET workflow-runs?trigger_id={id}`).",
        parameters=[
            OpenApiParameter("cursor", OpenApiTypes.STR, required=False),
            OpenApiParameter("limit", OpenApiTypes.INT, required=False),
        ],  # fmt: skip
        responses={200: NotificationSerializer(many=True), **errors(400, 404)},
    )
    @action(detail=True, methods=["get"])
    def notifications(self, request: Request, pk: str) -> Response:
        bulk = services.get_bulk_send(request.tenant, pk)
        paginator = RowCursorPagination()
        page = paginator.paginate_queryset(services.notifications_of(bulk), request, view=self)
        return paginator.get_paginated_response([notification_data(n) for n in page])
