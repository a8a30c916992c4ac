"""`workflows/{key}` (define), `workflows/{key}/trigger`, `workflows/{key}/cancel`, and
`workflow-runs[/{id}]` (read). Scoped with for_tenant(); another tenant's workflow or run is a 404.
Everything that changes data goes through workflows.services."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.pagination import StrictCursorPagination
from core.api.schema import StrictQueryMixin, errors
from core.api.viewsets import ConfigViewSet, actor, as_uuid, config_docs
from notifications.api.idempotency import run_idempotent_in_transaction
from notifications.api.views import IDEMPOTENCY_PARAM
from workflows import services
from workflows.api.serializers import (
    CancelResultSerializer,
    CancelSerializer,
    RunFilterSerializer,
    TriggerResultSerializer,
    TriggerSerializer,
    WorkflowRunSerializer,
    WorkflowSerializer,
)
from workflows.models import Workflow, WorkflowRun, resolve_runs


@extend_schema_view(
    **config_docs(WorkflowSerializer),
    trigger=extend_schema(
        description="Start one run per subscriber (unknown ones are created with no addresses), or with `topic` "
        "one run per member of the topic at this moment but `actor` (created asynchronously by the scheduler, "
        "in chunks; `runs` is their number). `data` is the template context's `data`; `cancellation_key` lets "
        "`cancel` stop the runs. `202` once the runs exist (or the fan-out is recorded); they advance through "
        "the scheduler. With an `Idempotency-Key`, a retry replays the first answer.",
        request=TriggerSerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={202: TriggerResultSerializer, **errors(400, 404, 409, 413, 422)},
    ),  # fmt: skip
    cancel=extend_schema(
        description="Stop the unfinished runs with this `cancellation_key` (of `subscribers`, if given) before "
        'their next step; the notifications they scheduled end `cancelled`. `{"cancelled": 0}` on a repeat.',
        request=CancelSerializer,
        responses={200: CancelResultSerializer, **errors(400, 404)},
    ),  # fmt: skip
)
class WorkflowViewSet(ConfigViewSet):
    serializer_class = WorkflowSerializer
    lookup_field = "key"
    model = Workflow

    def get_queryset(self) -> QuerySet[Workflow]:
        return services.workflows_of(super().get_queryset())

    def perform_create(self, serializer: WorkflowSerializer) -> None:
        workflow = Workflow(tenant=self.request.tenant, **serializer.validated_data)
        serializer.instance = services.save_workflow(workflow, actor=actor(self.request))

    def perform_update(self, serializer: WorkflowSerializer) -> None:
        workflow = serializer.instance
        for name, value in serializer.validated_data.items():
            setattr(workflow, name, value)
        services.save_workflow(workflow, actor=actor(self.request), fields=list(serializer.validated_data))

    def remove(self, instance: Any, *, actor: str) -> None:
        services.delete_workflow(instance, actor=actor)

    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, key: str) -> Response:
        return run_idempotent_in_transaction(request, self, lambda: self._trigger(request, key))

    def _trigger(self, request: Request, key: str) -> Response:
        services.get_workflow(request.tenant, key)  # 404 before the body's 400
        body = services.clean_trigger(request.data)
        if body["topic"] is not None:
            trigger_id, runs = services.trigger_topic(
                request.tenant, key, topic=body["topic"], data=body["data"],
                cancellation_key=body["cancellation_key"], trigger_actor=body["actor"], actor=actor(request),
            )  # fmt: skip
        else:
            trigger_id, runs = services.trigger(
                request.tenant, key, subscribers=body["subscribers"], data=body["data"],
                cancellation_key=body["cancellation_key"], trigger_actor=body["actor"], actor=actor(request),
            )  # fmt: skip
        return Response({"trigger_id": str(trigger_id), "runs": runs}, status=status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, key: str) -> Response:
        services.get_workflow(request.tenant, key)
        serializer = CancelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        cancelled = services.cancel(
            request.tenant, key, data["cancellation_key"], subscribers=data.get("subscribers"), actor=actor(request)
        )
        return Response({"cancelled": cancelled}, status=status.HTTP_200_OK)


_FILTERS = {"workflow": "workflow__key", "subscriber": "subscriber", "status": "status", "trigger_id": "trigger_id"}


@extend_schema_view(
    list=extend_schema(
        description="The tenant's workflow runs, newest first; filters `workflow` (key), `subscriber` (external id), "
        "`status`, `trigger_id`.",
        parameters=[OpenApiParameter(name, str, required=False) for name in _FILTERS],
        responses={200: WorkflowRunSerializer(many=True), **errors(400)},
    ),
    retrieve=extend_schema(
        description="One run with each step's state.", responses={200: WorkflowRunSerializer, **errors(404)}
    ),
)
class WorkflowRunViewSet(StrictQueryMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = WorkflowRunSerializer
    pagination_class = StrictCursorPagination
    lookup_value_regex = "[^/]+"

    def allowed_query_params(self) -> tuple[str, ...]:
        allowed = super().allowed_query_params()
        return (*allowed, *_FILTERS) if self.action == "list" else allowed

    def get_queryset(self) -> QuerySet[WorkflowRun]:
        if getattr(self, "swagger_fake_view", False):
            return WorkflowRun.objects.none()
        return services.runs_for(self.request.tenant)

    def filter_queryset(self, queryset: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
        if self.action != "list":
            return queryset
        filters = RunFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        return queryset.filter(**{_FILTERS[k]: v for k, v in filters.validated_data.items()})

    def paginate_queryset(self, queryset: QuerySet[WorkflowRun]) -> list[WorkflowRun] | None:
        page = super().paginate_queryset(queryset)
        resolve_runs(page or [])  # fan-out runs not started yet: their fan-out's steps, all pending
        return page

    def retrieve(self, request: Request, pk: str) -> Response:
        run = self.get_queryset().filter(pk=as_uuid(pk)).first()
        if run is None:
            raise NotFound("No workflow run with this id.")
        resolve_runs([run])
        return Response(WorkflowRunSerializer(run).data)
