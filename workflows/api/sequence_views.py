"""Drip sequences (`sequences/{key}`) and their enrollments (`sequences/{key}/enrollments/{id}`).

A sequence is an ordered list of steps `{offset_seconds, channel, template}`, kept as a workflow of
send and delay steps; an enrollment is a run of it (workflows.sequences). Enrolling one
recipient creates one notification per step at once, each rendered from its template with the
enrollment's `context` and scheduled at `starts_at + offset_seconds` (queued at once when already
due); those notifications are ordinary ones (`GET notifications/{id}`, cancellable one by one).
Removing the enrollment cancels every step not yet sent; a step being delivered finishes.

Recipients: an enrollment has one `recipient`, so every step of a sequence must take the same
recipient format — all email, all sms, or push/webhook (tokens/URLs). A journey across email and
SMS is two sequences. Scoped with for_tenant(); another tenant's key or id is a 404.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.pagination import StrictCursorPagination
from core.api.schema import StrictQueryMixin, errors
from core.api.viewsets import SLUG, actor
from notifications.api.idempotency import run_idempotent_in_transaction
from notifications.api.views import IDEMPOTENCY_PARAM
from workflows import sequences
from workflows.api.sequence_serializers import (
    EnrollmentCreateSerializer,
    EnrollmentSerializer,
    SequenceSerializer,
)
from workflows.models import Workflow, WorkflowRun


@extend_schema_view(
    list=extend_schema(description="The tenant's sequences with their steps, newest first.",
                       responses={200: SequenceSerializer(many=True), **errors(400)}),
    retrieve=extend_schema(description="One sequence with its steps.",
                           responses={200: SequenceSerializer, **errors(404)}),
    create=extend_schema(
        description="Define a sequence: 1–50 steps `{offset_seconds, channel, template}` run in the order given "
        "(offsets never decrease), all taking the same recipient format (email; sms; push/webhook). Steps cannot "
        "change afterwards: define a new key. `400` names the failing step index (`details.steps.<index>`); "
        "`409` when the key exists.",
        responses={201: SequenceSerializer, **errors(400, 409, 413)},
    ),
)
class SequenceViewSet(
    StrictQueryMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):  # fmt: skip
    """Define a sequence once (`POST`); its steps cannot change afterwards (define a new key)."""

    serializer_class = SequenceSerializer
    pagination_class = StrictCursorPagination
    lookup_field = "key"
    lookup_value_regex = SLUG

    def get_queryset(self) -> QuerySet[Workflow]:
        if getattr(self, "swagger_fake_view", False):
            return Workflow.objects.none()
        return sequences.sequences_for(self.request.tenant)

    def perform_create(self, serializer: SequenceSerializer) -> None:
        data = serializer.validated_data
        serializer.instance = sequences.create_sequence(
            self.request.tenant, data["key"], data["name"], data["steps"], actor=actor(self.request)
        )


@extend_schema_view(
    list=extend_schema(description="The sequence's enrollments with their steps, newest first.",
                       responses={200: EnrollmentSerializer(many=True), **errors(400, 404)}),
    retrieve=extend_schema(description="One enrollment with the status of each step's notification.",
                           responses={200: EnrollmentSerializer, **errors(404)}),
    create=extend_schema(
        description="Enroll one recipient: every step becomes a notification at once, rendered from its template "
        "with `context` and scheduled at `starts_at + offset_seconds` (queued now when already due). `recipient` "
        "must suit every step's channel; `provider` is a name or `{channel: name}` (default: the tenant's default "
        "provider of each step's channel). `400` details name `recipient`, or `steps.<index>` for a provider or "
        "template problem. With an `Idempotency-Key`, a retried request replays the first enrollment instead of "
        "enrolling the recipient twice.",
        request=EnrollmentCreateSerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={201: EnrollmentSerializer, **errors(400, 404, 409, 413, 422)},
    ),
    destroy=extend_schema(
        description="Remove the recipient: every step not yet sent (scheduled, queued, retrying) is cancelled with "
        "its scheduled job; a step being delivered finishes, delivered steps stay delivered. `409` once removed.",
        responses={204: OpenApiResponse(description="Removed; every step not yet sent is cancelled."),
                   **errors(404, 409)},  # fmt: skip
    ),
)
class EnrollmentViewSet(
    StrictQueryMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Enroll a recipient in a sequence (every step is scheduled at once), see its steps, remove it.

    Body: `recipient` (must suit every step's channel), `context` (template variables, ≤ 4 KiB),
    `starts_at` (ISO 8601 with offset; default now), `provider` (a name, or `{channel: name}`;
    default: the tenant's default provider of each step's channel). Removing cancels the steps not yet
    sent (`204`); `409` once removed.
    """

    serializer_class = EnrollmentSerializer
    pagination_class = StrictCursorPagination
    lookup_field = "pk"
    lookup_url_kwarg = "enrollment_id"

    def get_queryset(self) -> QuerySet[WorkflowRun]:
        if getattr(self, "swagger_fake_view", False):
            return WorkflowRun.objects.none()
        return sequences.enrollments_for(self.request.tenant, self.kwargs["key"])

    def get_serializer_class(self) -> type:
        return EnrollmentCreateSerializer if self.action == "create" else EnrollmentSerializer

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        sequences.get_sequence_id(request.tenant, kwargs["key"])  # 404 for an unknown key, not an empty list
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        runs = sequences.with_step_notifications(request.tenant, page)
        return self.get_paginated_response(EnrollmentSerializer(runs, many=True).data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        (run,) = sequences.with_step_notifications(request.tenant, [self.get_object()])
        return Response(EnrollmentSerializer(run).data)

    def create(self, request: Request, key: str) -> Response:
        return run_idempotent_in_transaction(request, self, lambda: self._enroll(request, key))

    def _enroll(self, request: Request, key: str) -> Response:
        serializer = EnrollmentCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        enrollment = sequences.enroll(
            request.tenant, key, recipient=data["recipient"], context=data["context"], starts_at=data["starts_at"],
            provider=data["provider"], actor=actor(request),
        )  # fmt: skip
        return Response(EnrollmentSerializer(enrollment).data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, key: str, enrollment_id: Any) -> Response:
        sequences.unenroll(request.tenant, key, enrollment_id, actor=actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
