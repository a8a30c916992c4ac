"""`dlq`: list, detail, redrive, discard and bulk redrive of the tenant's dead letters.

Every queryset starts with for_tenant(); another tenant's entry is a 404. Redrive and discard go
through dlq.services, which re-checks the entry's state inside its own transaction.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.errors import Conflict
from core.api.pagination import StrictCursorPagination
from core.api.schema import StrictQueryMixin, errors
from dlq import services
from dlq.api.serializers import (
    BulkRedriveResultSerializer,
    BulkRedriveSerializer,
    DeadLetterDetailSerializer,
    DeadLetterFilterSerializer,
    DeadLetterSerializer,
)
from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt

UUID_RE = "[0-9a-fA-F-]{36}"
_FILTER_LOOKUPS = {
    "failure_class": "failure_class",
    "status": "status",
    "provider": "provider__name",
    "created_after": "created_at__gte",
}


def _actor(request: Request) -> str:
    return request.user.actor


def _refusal(reason: str) -> Exception:
    if reason == services.NOT_FOUND:
        return NotFound("No dead-letter entry with this id.")
    return Conflict(f"Refused: {services.REASONS[reason]}.", code=reason)


class DeadLetterViewSet(StrictQueryMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = DeadLetterSerializer
    pagination_class = StrictCursorPagination
    lookup_value_regex = UUID_RE

    def allowed_query_params(self) -> tuple[str, ...]:
        allowed = super().allowed_query_params()
        return (*allowed, *DeadLetterFilterSerializer().fields) if self.action == "list" else allowed

    def get_queryset(self) -> QuerySet[DeadLetter]:
        if getattr(self, "swagger_fake_view", False):
            return DeadLetter.objects.none()
        qs = DeadLetter.objects.for_tenant(self.request.tenant).select_related("provider")
        if self.action in ("retrieve", "redrive", "discard"):
            qs = qs.select_related("notification")
        return qs

    def filter_queryset(self, queryset: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
        if self.action != "list":
            return queryset
        filters = DeadLetterFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        return queryset.filter(**{_FILTER_LOOKUPS[k]: v for k, v in filters.validated_data.items()})

    def _entry(self, pk: str) -> DeadLetter:
        try:
            return self.get_queryset().get(pk=UUID(pk))
        except (ValueError, DeadLetter.DoesNotExist):
            raise NotFound("No dead-letter entry with this id.") from None

    def _detail(self, entry: DeadLetter, code: int = status.HTTP_200_OK) -> Response:
        attempts = DeliveryAttempt.objects.for_tenant(self.request.tenant).filter(
            notification_id=entry.notification_id
        ).select_related("provider").order_by("number")  # fmt: skip
        return Response(DeadLetterDetailSerializer(entry, context={"attempts": list(attempts)}).data, status=code)

    @extend_schema(
        parameters=[DeadLetterFilterSerializer],
        responses={200: DeadLetterSerializer(many=True), **errors(400)},
        description="The tenant's dead-letter entries, newest first, cursor-paginated (`limit` 1–500).",
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(
        responses={200: DeadLetterDetailSerializer, **errors(404)},
        description="One entry with its notification's masked recipient, status and every delivery attempt.",
    )
    def retrieve(self, request: Request, pk: str) -> Response:
        return self._detail(self._entry(pk))

    @extend_schema(
        operation_id="dlq_redrive",
        request=None,
        responses={202: DeadLetterDetailSerializer, **errors(404, 409)},
        description="Re-queue the notification with a fresh attempt budget; the entry becomes `redriven`. "
        "409 `already_delivered` when the notification was delivered (it is never sent again), "
        "409 `not_open` when the entry was already redriven or discarded.",
    )
    @action(detail=True, methods=["post"])
    def redrive(self, request: Request, pk: str) -> Response:
        entry = self._entry(pk)
        result = services.redrive([entry.pk], actor=_actor(request), tenant=request.tenant)
        if entry.pk in result.refused:
            raise _refusal(result.refused[entry.pk])
        return self._detail(self._entry(pk), status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="dlq_discard",
        request=None,
        responses={200: DeadLetterDetailSerializer, **errors(404, 409)},
        description="Close the entry without sending anything; 409 `not_open` unless it is open.",
    )
    @action(detail=True, methods=["post"])
    def discard(self, request: Request, pk: str) -> Response:
        entry = self._entry(pk)
        result = services.discard([entry.pk], actor=_actor(request), tenant=request.tenant)
        if entry.pk in result.refused:
            raise _refusal(result.refused[entry.pk])
        return self._detail(self._entry(pk))

    @extend_schema(
        operation_id="dlq_redrive_matching",
        request=BulkRedriveSerializer,
        responses={200: BulkRedriveResultSerializer, **errors(400)},
        description="Redrive the open entries matching the filters (oldest first, at most `limit`). "
        "Entries whose notification was delivered are never redriven. A dry run only counts.",
        examples=[
            OpenApiExample("Redrive", value={"redriven": 120, "refused": 0, "dry_run": False}, response_only=True),
            OpenApiExample(
                "Dry run", value={"redriven": 0, "would_redrive": 120, "refused": 0, "dry_run": True},
                response_only=True,
            ),  # fmt: skip
        ],
    )
    @action(detail=False, methods=["post"], url_path="redrive")
    def bulk_redrive(self, request: Request) -> Response:
        body = BulkRedriveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        filters = services.RedriveFilters(
            tenant=request.tenant,
            failure_class=data.get("failure_class"),
            provider=data.get("provider"),
            created_after=data.get("created_after"),
        )
        entries = services.matching(filters)
        if data["dry_run"]:
            count = entries[: data["limit"]].count()
            return Response({"redriven": 0, "would_redrive": count, "refused": 0, "dry_run": True})
        ids = list(entries.values_list("pk", flat=True)[: data["limit"]])
        result = services.redrive(ids, actor=_actor(request), tenant=request.tenant, rate=data.get("rate"))
        return Response({"redriven": len(result.redriven), "refused": len(result.refused), "dry_run": False})
