"""The suppression list (`suppressions`). Every queryset starts with for_tenant(); adding and removing
go through notifications.suppressions (audited). Addresses are write-only and read back masked."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from notifications import suppressions, validation
from notifications.api.pagination import StrictCursorPagination
from notifications.api.schema import StrictCharField, StrictQueryMixin, StrictSerializer, errors
from notifications.api.views import actor, as_uuid
from notifications.models import Channel, Suppression, SuppressionReason
from notifications.validation import check_recipient


def iso(value: Any) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


class SuppressionSerializer(StrictSerializer):
    id = serializers.UUIDField(read_only=True)
    channel = serializers.ChoiceField(choices=Channel.choices)
    recipient = StrictCharField(write_only=True, max_length=validation.MAX_TOKEN_CHARS,
                                help_text="The address (write-only; read back as recipient_masked).")  # fmt: skip
    recipient_masked = serializers.CharField(read_only=True)
    reason = serializers.ChoiceField(choices=SuppressionReason.choices, default=SuppressionReason.MANUAL)
    category = StrictCharField(
        required=False, allow_null=True, max_length=100,
        help_text="null: every category on the channel; a category key: that category only.",
    )  # fmt: skip
    source_notification_id = serializers.UUIDField(read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        channel = attrs["channel"]
        try:
            attrs["recipient"] = check_recipient(suppressions.normalise(channel, attrs["recipient"]), channel)
        except ValueError as exc:
            raise serializers.ValidationError({"recipient": [str(exc)]}) from None
        reason = attrs.get("reason", SuppressionReason.MANUAL)
        if reason in suppressions.ADDRESS_REASONS and channel not in suppressions.ADDRESS_CHANNELS:
            raise serializers.ValidationError(
                {"reason": [f"{reason} suppresses email and sms addresses only; use manual for {channel}"]}
            )
        return attrs

    def to_representation(self, s: Suppression) -> dict[str, Any]:
        return {
            "id": str(s.pk), "channel": s.channel, "recipient_masked": s.recipient_masked, "reason": s.reason,
            "category": s.category, "created_at": iso(s.created_at),
            "source_notification_id": str(s.source_notification_id) if s.source_notification_id else None,
        }  # fmt: skip


RECIPIENT_PARAM = OpenApiParameter(
    "recipient", str, description="An exact address (emails case-insensitively, phones in E.164)."
)
CHANNEL_PARAM = OpenApiParameter("channel", str, enum=Channel.values)


class SuppressionViewSet(
    StrictQueryMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):  # fmt: skip
    serializer_class = SuppressionSerializer
    pagination_class = StrictCursorPagination
    lookup_value_regex = "[0-9a-fA-F-]{36}"

    def allowed_query_params(self) -> tuple[str, ...]:
        allowed = super().allowed_query_params()
        return (*allowed, "recipient", "channel") if self.action == "list" else allowed

    def get_queryset(self) -> QuerySet[Suppression]:
        if getattr(self, "swagger_fake_view", False):
            return Suppression.objects.none()
        return Suppression.objects.for_tenant(self.request.tenant)

    def filter_queryset(self, queryset: QuerySet[Suppression]) -> QuerySet[Suppression]:
        if self.action != "list":
            return queryset
        params = self.request.query_params
        channel = params.get("channel")
        if channel is not None and channel not in Channel.values:
            raise serializers.ValidationError({"channel": [f"must be one of {', '.join(Channel.values)}"]})
        recipient = params.get("recipient")
        if recipient is not None:
            if not 1 <= len(recipient) <= validation.MAX_TOKEN_CHARS:
                raise serializers.ValidationError({"recipient": ["must be an address"]})
            return suppressions.matching(self.request.tenant.pk, recipient, channel)
        return queryset.filter(channel=channel) if channel else queryset

    @extend_schema(parameters=[RECIPIENT_PARAM, CHANNEL_PARAM],
                   responses={200: SuppressionSerializer(many=True), **errors(400)})  # fmt: skip
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: SuppressionSerializer, **errors(404)})
    def retrieve(self, request: Request, pk: str) -> Response:
        entry = self.get_queryset().filter(pk=as_uuid(pk)).first()
        if entry is None:
            raise NotFound()
        return Response(SuppressionSerializer(entry).data)

    @extend_schema(request=SuppressionSerializer,
                   responses={201: SuppressionSerializer, 200: SuppressionSerializer, **errors(400, 413)})  # fmt: skip
    def create(self, request: Request) -> Response:
        """Add an entry (201); the same entry again answers 200 with the one there is."""
        serializer = SuppressionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        entry, created = suppressions.suppress(
            request.tenant.pk, data["channel"], data["recipient"], data.get("reason", SuppressionReason.MANUAL),
            data.get("category"), actor=actor(request),
        )  # fmt: skip
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(SuppressionSerializer(entry).data, status=code)

    @extend_schema(responses={204: None, **errors(404)})
    def destroy(self, request: Request, pk: str) -> Response:
        if not suppressions.remove(request.tenant.pk, as_uuid(pk), actor=actor(request)):
            raise NotFound()
        return Response(status=status.HTTP_204_NO_CONTENT)
