"""`topics[/{key}]` and `topics/{key}/subscribers`: a tenant's named groups of subscribers. Every
queryset starts with for_tenant() (another tenant's topic is a 404); changes go through
recipients.topics."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.pagination import StrictCursorPagination
from core.api.schema import StrictCharField, StrictQueryMixin, StrictSerializer, errors
from core.api.viewsets import actor
from core.validation import NAME
from recipients import services, topics
from recipients.models import Topic, TopicSubscriber


class TopicSerializer(serializers.ModelSerializer):
    class Meta:
        model = Topic
        fields = ["key", "name", "subscriber_count", "created_at", "updated_at"]
        read_only_fields = fields


class TopicWriteSerializer(StrictSerializer):
    name = StrictCharField(required=False, allow_blank=True, max_length=200, default="")


class MembersSerializer(StrictSerializer):
    subscribers = serializers.ListField(
        child=serializers.CharField(max_length=200), min_length=1, max_length=topics.MAX_MEMBERS_A_CALL,
        help_text="1 to 1,000 subscriber external ids; unknown ones are created with no addresses.",
    )  # fmt: skip

    def validate_subscribers(self, value: list[Any]) -> list[str]:
        problems = []
        for index, item in enumerate(value):
            try:
                services.check_external_id(item)
            except ValueError as exc:
                problems.append(f"item {index}: {exc}")
        if problems:
            raise serializers.ValidationError(problems)
        return value

    def to_internal_value(self, data: Any) -> Any:  # noqa: ANN401
        if isinstance(data, dict) and isinstance(data.get("subscribers"), list):
            # the list's items are checked as they came (a number is not an external id)
            bad = [i for i, item in enumerate(data["subscribers"]) if not isinstance(item, str)]
            if bad:
                raise serializers.ValidationError(
                    {"subscribers": [f"item {i}: must be a string (a subscriber's external id)" for i in bad[:20]]}
                )
        return super().to_internal_value(data)


class MemberSerializer(serializers.ModelSerializer):
    class Meta:
        model = TopicSubscriber
        fields = ["subscriber", "added_at"]
        read_only_fields = fields


class MembersPagination(StrictCursorPagination):
    """Members in the order they joined."""

    ordering = ("id",)


def _check_key(key: str) -> None:
    if not NAME.fullmatch(key):
        raise serializers.ValidationError({"key": ["must be 1 to 100 letters, digits, '-' or '_'"]})


class TopicViewSet(StrictQueryMixin, viewsets.GenericViewSet):
    serializer_class = TopicSerializer
    pagination_class = StrictCursorPagination
    lookup_field = "key"
    lookup_value_regex = "[^/]+"

    def get_queryset(self) -> QuerySet[Topic]:
        if getattr(self, "swagger_fake_view", False):
            return Topic.objects.none()
        return topics.topics_for(self.request.tenant)

    def allowed_query_params(self) -> tuple[str, ...]:
        allowed = super().allowed_query_params()
        if self.action == "members":
            return (*allowed, "cursor", "limit")
        return allowed

    @extend_schema(description="The tenant's topics, newest first (cursor).",
                   responses={200: TopicSerializer(many=True), **errors(400)})  # fmt: skip
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(TopicSerializer(page, many=True).data)

    @extend_schema(description="One topic with its `subscriber_count`.",
                   responses={200: TopicSerializer, **errors(404)})  # fmt: skip
    def retrieve(self, request: Request, key: str) -> Response:
        return Response(TopicSerializer(topics.get_topic(request.tenant, key)).data)

    @extend_schema(description="Create (201) or rename (200) the topic the URL names.",
                   request=TopicWriteSerializer, responses={201: TopicSerializer, 200: TopicSerializer,
                                                            **errors(400)})  # fmt: skip
    def update(self, request: Request, key: str) -> Response:
        _check_key(key)
        body = TopicWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        topic, created = topics.put_topic(request.tenant, key, body.validated_data["name"], actor=actor(request))
        return Response(TopicSerializer(topic).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        description="Delete the topic: gone at once (its key free again, triggers to it refused); its memberships "
        "are deleted in the background (its subscribers stay), and a trigger to it still fanning out stops.",
        responses={204: None, **errors(404)},
    )
    def destroy(self, request: Request, key: str) -> Response:
        topics.delete_topic(request.tenant, key, actor=actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(description="The topic's subscribers in the order they joined (cursor).",
                   responses={200: MemberSerializer(many=True), **errors(400, 404)})  # fmt: skip
    def members(self, request: Request, key: str) -> Response:
        topic = topics.get_topic(request.tenant, key)
        paginator = MembersPagination()
        page = paginator.paginate_queryset(topics.members_for(topic), request, view=self)
        return paginator.get_paginated_response(MemberSerializer(page, many=True).data)

    @extend_schema(
        description="Add up to 1,000 subscribers (unknown ones are created with no addresses); `added` counts "
        "the memberships that are new.",
        request=MembersSerializer,
        responses={200: inline_serializer("TopicAdded", {"added": serializers.IntegerField()}),
                   **errors(400, 404, 409)},
    )  # fmt: skip
    def add_members(self, request: Request, key: str) -> Response:
        topics.get_topic(request.tenant, key)  # 404 before the body's 400
        body = MembersSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        added = topics.add_members(request.tenant, key, body.validated_data["subscribers"], actor=actor(request))
        return Response({"added": added})

    @extend_schema(
        description="Remove up to 1,000 subscribers from the topic; `removed` counts the memberships that ended.",
        request=MembersSerializer,
        responses={200: inline_serializer("TopicRemoved", {"removed": serializers.IntegerField()}),
                   **errors(400, 404)},
    )  # fmt: skip
    def remove_members(self, request: Request, key: str) -> Response:
        topics.get_topic(request.tenant, key)
        body = MembersSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        removed = topics.remove_members(request.tenant, key, body.validated_data["subscribers"], actor=actor(request))
        return Response({"removed": removed})


topic_list = TopicViewSet.as_view({"get": "list"})
topic_detail = TopicViewSet.as_view({"get": "retrieve", "put": "update", "delete": "destroy"})
topic_members = TopicViewSet.as_view({"get": "members", "post": "add_members", "delete": "remove_members"})
