"""Notifications, scheduled jobs and queue figures. Every queryset starts with for_tenant();
another tenant's object is a 404. Creation and cancelling go through notifications.services."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.errors import Conflict
from core.api.pagination import StrictCursorPagination
from core.api.schema import StrictQueryMixin, errors
from core.api.viewsets import actor, as_uuid
from core.models import Tenant
from core.validation import FieldErrors, unknown_fields
from notifications import reads, services
from notifications.api.idempotency import HEADER, render, respond, run_idempotent
from notifications.api.serializers import (
    NotificationBatchResultSerializer,
    NotificationBatchSerializer,
    NotificationCreateSerializer,
    NotificationDetailSerializer,
    NotificationFilterSerializer,
    NotificationSerializer,
    ScheduledJobSerializer,
    notification_data,
    notification_detail_data,
)
from notifications.models import Notification
from notifications.validation import Draft, clean_notification
from queueing.models import DEFAULT_JOB_KIND, ScheduledJob
from queueing.stats import queue_figures

MAX_BATCH = 1000

IDEMPOTENCY_PARAM = OpenApiParameter(
    HEADER, {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"}, OpenApiParameter.HEADER,
    required=False,
    description="Makes the POST safe to retry for 24 h: same key and body replays the first response "
    "(header `Idempotent-Replayed: true`); another body is 422; while the first runs, 409.",
)  # fmt: skip


class CurrentTenantView(StrictQueryMixin, APIView):
    """The tenant the calling API key belongs to."""

    @extend_schema(
        responses={
            200: inline_serializer("Tenant", {"id": serializers.UUIDField(), "name": serializers.CharField()}),
            **errors(),
        }
    )
    def get(self, request: Request) -> Response:
        return Response({"id": str(request.tenant.pk), "name": request.tenant.name})


class NotificationViewSet(StrictQueryMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = NotificationSerializer
    pagination_class = StrictCursorPagination
    lookup_value_regex = "[0-9a-fA-F-]{36}"

    def allowed_query_params(self) -> tuple[str, ...]:
        allowed = super().allowed_query_params()
        return (*allowed, *NotificationFilterSerializer().fields) if self.action == "list" else allowed

    def get_queryset(self) -> QuerySet[Notification]:
        if getattr(self, "swagger_fake_view", False):
            return Notification.objects.none()
        # The job by notification_id within the tenant (scheduled_jobs keeps no foreign key to it).
        job = ScheduledJob.objects.for_tenant(self.request.tenant).filter(notification_id=OuterRef("pk"))
        qs = (
            Notification.objects.for_tenant(self.request.tenant)
            .select_related("provider", "template")
            .annotate(scheduled_job_id=Subquery(job.values("job_id")[:1]))
            .with_live_status()
        )
        return qs

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return NotificationDetailSerializer if self.action in ("retrieve", "cancel") else NotificationSerializer

    def filter_queryset(self, queryset: QuerySet[Notification]) -> QuerySet[Notification]:
        if self.action != "list":
            return queryset
        filters = NotificationFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        wanted = dict(filters.validated_data)
        if "status" in wanted:  # as clients see it: `dispatching` is a live lease, not a stored value
            queryset = queryset.with_live_status_of(wanted.pop("status"))
        lookups = {"channel": "channel", "receipt": "receipt", "created_after": "created_at__gte",
                   "created_before": "created_at__lt"}  # fmt: skip
        return queryset.filter(**{lookups[k]: v for k, v in wanted.items()})

    @extend_schema(parameters=[NotificationFilterSerializer], responses={200: NotificationSerializer(many=True),
                                                                         **errors(400)})  # fmt: skip
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: NotificationDetailSerializer, **errors(404)})
    def retrieve(self, request: Request, pk: str) -> Response:
        data = detail_data(request.tenant, as_uuid(pk))
        if data is None:
            raise NotFound()
        return Response(data)

    @extend_schema(
        request=NotificationCreateSerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={201: NotificationSerializer, **errors(400, 409, 413, 422)},
    )
    def create(self, request: Request) -> Response:
        return run_idempotent(request, self, lambda record: self._create([request.data], single=True, record=record))

    @extend_schema(
        request=NotificationBatchSerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={201: NotificationBatchResultSerializer, **errors(400, 409, 413, 422)},
    )
    @action(detail=False, methods=["post"], url_path="batch")
    def batch(self, request: Request) -> Response:
        return run_idempotent(
            request, self, lambda record: self._create(self._batch_items(request.data), single=False, record=record)
        )

    @extend_schema(request=None, responses={200: NotificationDetailSerializer, **errors(404, 409)})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        notification = services.cancel_notification(request.tenant, as_uuid(pk), actor=actor(request))
        return Response(NotificationDetailSerializer(notification).data)

    # --- helpers -----------------------------------------------------------------------------------

    @staticmethod
    def _batch_items(data: Any) -> list[Any]:
        if not isinstance(data, dict):
            raise ValidationError({"non_field_errors": ['the body must be {"notifications": [...]}']})
        unknown = unknown_fields(data, ("notifications",))
        if unknown:
            raise ValidationError(unknown)
        items = data.get("notifications")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
            raise ValidationError({"notifications": [f"must be a list of 1 to {MAX_BATCH} notification objects"]})
        return items

    def _create(
        self, items: list[Any], *, single: bool, record: services.IdempotentResponse | None
    ) -> Response | HttpResponse:
        return create_response(self.request.tenant, actor(self.request), items, single=single, record=record)


def detail_data(tenant: Tenant, notification_id: UUID) -> dict[str, Any] | None:
    """`GET notifications/{id}`'s body, or None (another tenant's id too): one statement, see
    notifications.reads. The view and the hot path (notifications.api.hot) both answer with it."""
    notification = reads.detail(tenant, notification_id)
    if notification is None:
        return None
    return notification_detail_data(notification)


def create_response(
    tenant: Tenant, actor: str, items: list[Any], *, single: bool, record: services.IdempotentResponse | None,
    before_store: Callable[[], None] | None = None, shared: bool = False,
) -> Response | HttpResponse:  # fmt: skip
    """Check every item, resolve names and render templates, then store all or nothing (with
    the Idempotency-Key's `record` and the response it replays, when there is one).
    `before_store`, `shared`: see `create_rows`."""
    if record is not None:
        record.render = lambda rows: render(status.HTTP_201_CREATED, _data(rows, single))
    rows = create_rows(tenant, actor, items, single=single, record=record, before_store=before_store, shared=shared)
    if record is not None:
        return respond(record)
    return Response(_data(rows, single), status=status.HTTP_201_CREATED)


def create_rows(
    tenant: Tenant, actor: str, items: list[Any], *, single: bool, record: services.IdempotentResponse | None = None,
    before_store: Callable[[], None] | None = None, shared: bool = False,
) -> list[Notification]:  # fmt: skip
    """`create_response`'s work: the stored notifications, or ValidationError (field errors) /
    Conflict. `before_store` runs once, after every check passed and before anything is stored
    (the hot path's rate limit, see notifications.api.hot); whatever it raises stops the create.
    `shared`: the statement may be shared with concurrent requests (services.create_notifications_shared)."""
    store = services.create_notifications_shared if shared else services.create_notifications
    problems: dict[int, dict[str, list[str]]] = {}
    drafts: list[tuple[int, Draft]] = []
    for index, item in enumerate(items):
        try:
            drafts.append((index, clean_notification(item)))
        except FieldErrors as exc:
            problems[index] = exc.errors
    for _ in range(3):  # a provider or template edited meanwhile: resolve again
        try:
            specs = services.build_specs(tenant, [d for _, d in drafts])
        except services.SpecErrors as exc:
            for position, errs in exc.errors.items():
                problems[drafts[position][0]] = errs
            specs = []
        if problems:
            if single:
                raise ValidationError(problems[0])
            raise ValidationError({"notifications": {str(i): problems[i] for i in sorted(problems)}})
        if before_store is not None:
            before_store()
            before_store = None
        try:
            return store(tenant, specs, actor=actor, idempotency=record)
        except services.StaleConfig:
            continue
    raise Conflict("The tenant's providers or templates are being changed; retry.", code="conflict")


def _data(rows: list[Notification], single: bool) -> dict[str, Any]:
    if single:
        return notification_data(rows[0])
    return {"results": [notification_data(n) for n in rows]}


class ScheduledJobViewSet(StrictQueryMixin, mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = ScheduledJobSerializer
    pagination_class = StrictCursorPagination
    lookup_field = "job_id"
    lookup_value_regex = "[0-9a-fA-F-]{36}"

    def get_queryset(self) -> QuerySet[ScheduledJob]:
        if getattr(self, "swagger_fake_view", False):
            return ScheduledJob.objects.none()
        # A workflow run's wait is a job of another kind: its run, not this API, manages it.
        return ScheduledJob.objects.for_tenant(self.request.tenant).filter(kind=DEFAULT_JOB_KIND)

    @extend_schema(responses={200: ScheduledJobSerializer(many=True), **errors(400)})
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={204: OpenApiResponse(description="Cancelled; its notification too."),
                              **errors(404, 409)})  # fmt: skip
    def destroy(self, request: Request, job_id: str) -> Response:
        services.cancel_scheduled_job(request.tenant, as_uuid(job_id), actor=actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class QueueStatsView(StrictQueryMixin, APIView):
    """Per queue: depth, ready, leased, delayed, oldest ready age and depth by priority."""

    @extend_schema(
        responses={
            200: inline_serializer(
                "QueueStats",
                {
                    "results": inline_serializer(
                        "QueueFigures",
                        {
                            "queue": serializers.CharField(),
                            "depth": serializers.IntegerField(),
                            "ready": serializers.IntegerField(),
                            "leased": serializers.IntegerField(),
                            "delayed": serializers.IntegerField(),
                            "oldest_age_seconds": serializers.FloatField(),
                            "by_priority": serializers.DictField(child=serializers.IntegerField()),
                        },
                        many=True,
                    )
                },
            ),
            **errors(),
        }
    )
    def get(self, request: Request) -> Response:
        return Response({"results": queue_figures([request.tenant.pk])})
