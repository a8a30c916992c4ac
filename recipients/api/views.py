"""Recipients: the suppression list (`suppressions`), `categories` and `subscribers`. Every queryset
starts with for_tenant(); changes go through recipients.suppressions and recipients.services
(audited). Addresses are write-only and read back masked."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.pagination import StrictCursorPagination
from core.api.schema import (
    StrictBooleanField,
    StrictCharField,
    StrictQueryMixin,
    StrictRegexField,
    StrictSerializer,
    errors,
    iso,
)
from core.api.viewsets import actor, as_uuid, config_docs
from core.channels import Channel
from core.masking import mask_email
from core.validation import MAX_TOKEN_CHARS, NAME, FieldErrors, check_recipient, unknown_fields
from recipients import devices, services, suppressions, unsubscribe
from recipients.models import Category, Device, DeviceKind, Subscriber, Suppression, SuppressionReason

MAX_BULK_SUBSCRIBERS = 1000


class SuppressionSerializer(StrictSerializer):
    id = serializers.UUIDField(read_only=True)
    channel = serializers.ChoiceField(choices=Channel.choices)
    recipient = StrictCharField(write_only=True, max_length=MAX_TOKEN_CHARS,
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
            if not 1 <= len(recipient) <= MAX_TOKEN_CHARS:
                raise serializers.ValidationError({"recipient": ["must be an address"]})
            return suppressions.matching(self.request.tenant, recipient, channel)
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
        category = data.get("category")
        if category is not None and category not in services.fresh_category_keys(request.tenant, {category}):
            raise serializers.ValidationError({"category": [f"no category with key {category!r}"]})
        entry, created = suppressions.suppress(
            request.tenant, data["channel"], data["recipient"], data.get("reason", SuppressionReason.MANUAL),
            data.get("category"), actor=actor(request),
        )  # fmt: skip
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(SuppressionSerializer(entry).data, status=code)

    @extend_schema(responses={204: None, **errors(404)})
    def destroy(self, request: Request, pk: str) -> Response:
        if not suppressions.remove(request.tenant, as_uuid(pk), actor=actor(request)):
            raise NotFound()
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- unsubscribe tokens ---------------------------------------------------------------------------


class TokenRevokeSerializer(StrictSerializer):
    token = StrictCharField(
        max_length=4096, trim_whitespace=False,
        help_text="The token of one email's List-Unsubscribe link, or the whole link "
        "(https URL or the mailto's subject).",
    )  # fmt: skip


class UnsubscribeTokenRevokeView(StrictQueryMixin, viewsets.ViewSet):
    """`POST unsubscribe-tokens/revoke`: one email's unsubscribe link stops working (a forwarded or
    leaked one), every other email's keeps working."""

    @extend_schema(
        request=TokenRevokeSerializer,
        responses={200: inline_serializer("UnsubscribeTokenRevoked", {
            "revoked": serializers.BooleanField(), "already_revoked": serializers.BooleanField(),
            "category": serializers.CharField(), "recipient_masked": serializers.CharField(),
        }), **errors(400)},
    )  # fmt: skip
    def create(self, request: Request) -> Response:
        body = TokenRevokeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        token = _token_of(body.validated_data["token"])
        try:
            category, address, created = unsubscribe.revoke(request.tenant.pk, token, actor=actor(request))
        except unsubscribe.BadToken:
            raise serializers.ValidationError(
                {"token": ["not an unsubscribe token of this tenant (forged, altered, or another tenant's)"]}
            ) from None
        return Response({"revoked": True, "already_revoked": not created, "category": category,
                         "recipient_masked": mask_email(address)})  # fmt: skip


def _token_of(value: str) -> str:
    """The token in what a tenant pastes: the token, the https link (…/unsubscribe/<token>) or the
    mailto's subject (`unsubscribe <token>`)."""
    if unsubscribe.PATH in value:
        value = value.rsplit(unsubscribe.PATH, 1)[1].split("?", 1)[0].split("#", 1)[0]
    elif value[:12].lower().startswith("unsubscribe "):
        value = value[12:]
    return value


# --- categories -----------------------------------------------------------------------------------


class CategorySerializer(StrictSerializer):
    key = StrictRegexField(NAME.pattern, max_length=100)
    critical = StrictBooleanField(required=False, default=False,
                                  help_text="Critical categories ignore opt-outs (never suppressions).")  # fmt: skip
    description = StrictCharField(required=False, allow_blank=True, max_length=services.MAX_DESCRIPTION_CHARS)
    quiet_hours = serializers.JSONField(
        required=False, allow_null=True,
        help_text='{"start": "HH:MM", "end": "HH:MM"} in the recipient\'s time zone, end exclusive, may cross '
                  'midnight; {"start": "00:00", "end": "00:00"}: none; null: general\'s (the tenant default). '
                  "A non-critical notification created inside it is scheduled for its end.",
    )  # fmt: skip

    def validate_quiet_hours(self, value: Any) -> Any:
        try:
            return services.check_quiet_hours(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        instance = getattr(self, "instance", None)
        if instance is not None and "key" in attrs and attrs["key"] != instance.key:
            raise serializers.ValidationError({"key": ["cannot be changed after creation; create a new category"]})
        return attrs

    def to_representation(self, c: Category) -> dict[str, Any]:
        return {"key": c.key, "critical": c.critical, "description": c.description, "quiet_hours": c.quiet_hours}


@extend_schema_view(**config_docs(CategorySerializer))
class CategoryViewSet(StrictQueryMixin, viewsets.ModelViewSet):
    serializer_class = CategorySerializer
    pagination_class = StrictCursorPagination
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    lookup_field = "key"
    lookup_value_regex = "[-a-zA-Z0-9_]+"

    def get_queryset(self) -> QuerySet[Category]:
        if getattr(self, "swagger_fake_view", False):
            return Category.objects.none()
        services.ensure_general(self.request.tenant)
        return Category.objects.for_tenant(self.request.tenant)

    def perform_create(self, serializer: CategorySerializer) -> None:
        category = Category(tenant=self.request.tenant, **serializer.validated_data)
        serializer.instance = self._save(category)

    def perform_update(self, serializer: CategorySerializer) -> None:
        category = serializer.instance
        for name, value in serializer.validated_data.items():
            setattr(category, name, value)
        self._save(category, fields=list(serializer.validated_data))

    def _save(self, category: Category, fields: list[str] | None = None) -> Category:
        try:
            return services.save_category(category, actor=actor(self.request), fields=fields)
        except FieldErrors as exc:
            raise serializers.ValidationError(exc.errors) from None

    def perform_destroy(self, instance: Category) -> None:
        services.delete_category(instance, actor=actor(self.request))


# --- subscribers ----------------------------------------------------------------------------------

EXTERNAL_ID = r"[^/]{1,200}"


class SubscriberSerializer(serializers.Serializer):
    """A subscriber as read back: addresses masked only (the write fields take them in clear)."""

    external_id = serializers.CharField()
    email_masked = serializers.CharField(allow_blank=True)
    phone_masked = serializers.CharField(allow_blank=True)
    push_tokens_masked = serializers.ListField(child=serializers.CharField())
    timezone = serializers.CharField(allow_blank=True)
    locale = serializers.CharField(allow_blank=True, help_text="BCP 47 tag: which template variant it reads.")
    preferences = serializers.DictField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def to_representation(self, s: Subscriber) -> dict[str, Any]:
        return {
            "external_id": s.external_id, "email_masked": s.email_masked, "phone_masked": s.phone_masked,
            "push_tokens_masked": list(s.push_tokens_masked or []), "timezone": s.timezone,
            "locale": s.locale,
            "preferences": s.preferences or {}, "created_at": iso(s.created_at), "updated_at": iso(s.updated_at),
        }  # fmt: skip


class SubscriberWriteSerializer(StrictSerializer):
    """The body of PUT/PATCH subscribers/{external_id}."""

    email = StrictCharField(required=False, allow_null=True, help_text="Stored encrypted; read back masked.")
    phone = StrictCharField(required=False, allow_null=True, help_text="E.164; stored encrypted.")
    push_tokens = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True,
                                        help_text="Push goes to the first one.")  # fmt: skip
    timezone = StrictCharField(required=False, allow_blank=True, help_text="IANA name, e.g. Europe/Berlin.")
    locale = StrictCharField(required=False, allow_blank=True, allow_null=True,
                             help_text="BCP 47 tag, e.g. fr-CA: its notifications' template variant.")  # fmt: skip
    preferences = serializers.DictField(required=False, help_text='{"<category>": {"<channel>": true|false}}')


class SubscriberBulkSerializer(StrictSerializer):
    subscribers = serializers.ListField(child=serializers.DictField(), min_length=1,
                                        max_length=MAX_BULK_SUBSCRIBERS)  # fmt: skip


def _field_errors(call: Any) -> Any:
    try:
        return call()
    except FieldErrors as exc:
        raise serializers.ValidationError(exc.errors) from None


class SubscriberViewSet(StrictQueryMixin, viewsets.GenericViewSet):
    serializer_class = SubscriberSerializer
    pagination_class = StrictCursorPagination
    lookup_field = "external_id"
    lookup_value_regex = EXTERNAL_ID

    def get_queryset(self) -> QuerySet[Subscriber]:
        if getattr(self, "swagger_fake_view", False):
            return Subscriber.objects.none()
        return Subscriber.objects.for_tenant(self.request.tenant).defer("email", "phone", "push_tokens")

    def _get(self, external_id: str) -> Subscriber:
        subscriber = self.get_queryset().filter(external_id=external_id).first()
        if subscriber is None:
            raise NotFound()
        return subscriber

    @extend_schema(responses={200: SubscriberSerializer(many=True), **errors(400)})
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response([SubscriberSerializer(s).data for s in page])

    @extend_schema(responses={200: SubscriberSerializer, **errors(404)})
    def retrieve(self, request: Request, external_id: str) -> Response:
        return Response(SubscriberSerializer(self._get(external_id)).data)

    @extend_schema(request=SubscriberWriteSerializer,
                   responses={201: SubscriberSerializer, 200: SubscriberSerializer, **errors(400, 413)})  # fmt: skip
    def update(self, request: Request, external_id: str) -> Response:
        """Create (201) or replace (200) the subscriber the URL names."""
        _check_external_id(external_id)
        keys = services.fresh_category_keys(request.tenant, _preference_keys([request.data]))
        clean = _field_errors(lambda: services.clean_subscriber(request.data, external_id=external_id,
                                                                  categories=keys))  # fmt: skip
        created = services.upsert_subscribers(request.tenant, [clean])[external_id]
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(SubscriberSerializer(self._get(external_id)).data, status=code)

    @extend_schema(request=SubscriberWriteSerializer, responses={200: SubscriberSerializer, **errors(400, 404, 413)})
    def partial_update(self, request: Request, external_id: str) -> Response:
        keys = services.fresh_category_keys(request.tenant, _preference_keys([request.data]))
        changes = _field_errors(lambda: services.clean_subscriber(request.data, external_id=external_id,
                                                                    categories=keys, partial=True))  # fmt: skip
        changes.pop("external_id", None)
        subscriber = services.patch_subscriber(request.tenant, external_id, changes)
        if subscriber is None:
            raise NotFound()
        return Response(SubscriberSerializer(subscriber).data)

    @extend_schema(responses={204: None, **errors(404)})
    def destroy(self, request: Request, external_id: str) -> Response:
        if not services.delete_subscriber(request.tenant, external_id, actor=actor(request)):
            raise NotFound()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=SubscriberBulkSerializer,
        responses={200: inline_serializer("SubscriberBulkResult", {
            "results": inline_serializer("SubscriberBulkItem", {
                "external_id": serializers.CharField(), "created": serializers.BooleanField()}, many=True)}),
            **errors(400, 413)},
    )  # fmt: skip
    def bulk(self, request: Request) -> Response:
        """Create or replace up to 1,000 subscribers in one statement: all or nothing."""
        data = request.data
        if not isinstance(data, dict) or unknown_fields(data, ("subscribers",)):
            raise serializers.ValidationError({"subscribers": ['the body must be {"subscribers": [...]}']})
        items = data.get("subscribers")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BULK_SUBSCRIBERS:
            raise serializers.ValidationError(
                {"subscribers": [f"must be a list of 1 to {MAX_BULK_SUBSCRIBERS} subscriber objects"]}
            )
        keys = services.fresh_category_keys(request.tenant, _preference_keys(items))
        problems: dict[str, Any] = {}
        rows, seen = [], set()
        for index, item in enumerate(items):
            try:
                row = services.clean_subscriber(item, categories=keys)
            except FieldErrors as exc:
                problems[str(index)] = exc.errors
                continue
            if row["external_id"] in seen:
                problems[str(index)] = {"external_id": ["appears twice in this request"]}
                continue
            seen.add(row["external_id"])
            rows.append(row)
        if problems:
            raise serializers.ValidationError({"subscribers": problems})
        created = services.upsert_subscribers(request.tenant, rows)
        return Response({"results": [{"external_id": r["external_id"], "created": created[r["external_id"]]}
                                     for r in rows]})  # fmt: skip


def _check_external_id(external_id: str) -> None:
    try:
        services.check_external_id(external_id)
    except ValueError as exc:
        raise serializers.ValidationError({"external_id": [str(exc)]}) from None


def _preference_keys(items: list[Any]) -> set[str]:
    keys: set[str] = set()
    for item in items:
        preferences = item.get("preferences") if isinstance(item, dict) else None
        if isinstance(preferences, dict):
            keys.update(k for k in preferences if isinstance(k, str))
    return keys


# --- devices --------------------------------------------------------------------------------------


class DeviceSerializer(serializers.Serializer):
    """A push device as read back: its token masked (a Web Push endpoint shows its origin only)."""

    id = serializers.UUIDField()
    kind = serializers.ChoiceField(choices=DeviceKind.choices)
    token_masked = serializers.CharField()
    active = serializers.BooleanField()
    deactivated_reason = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)

    def to_representation(self, d: Device) -> dict[str, Any]:
        return {
            "id": str(d.pk), "kind": d.kind, "token_masked": d.token_masked, "active": d.active,
            "deactivated_reason": d.deactivated_reason or None, "created_at": iso(d.created_at),
            "last_used_at": iso(d.last_used_at),
        }  # fmt: skip


class DeviceRegistrationSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=DeviceKind.choices)
    token = StrictCharField(required=False, help_text="fcm and apns: the device token (stored encrypted).")
    subscription = serializers.DictField(
        required=False,
        help_text='webpush: the PushSubscription\'s JSON, {"endpoint": "https://…", "keys": {"p256dh": …, "auth": …}}.',
    )  # fmt: skip


class DeviceViewSet(StrictQueryMixin, viewsets.GenericViewSet):
    """`subscribers/{external_id}/devices`: register (201; the same token again 200, moved to this
    subscriber), list (newest first) and remove a subscriber's push devices."""

    serializer_class = DeviceSerializer
    pagination_class = StrictCursorPagination

    def _subscriber(self, external_id: str) -> Subscriber:
        subscriber = (
            Subscriber.objects.for_tenant(self.request.tenant).filter(external_id=external_id)
            .only("id", "tenant_id", "external_id").first()
        )  # fmt: skip
        if subscriber is None:
            raise NotFound()
        return subscriber

    def get_queryset(self) -> QuerySet[Device]:
        if getattr(self, "swagger_fake_view", False):
            return Device.objects.none()
        subscriber = self._subscriber(self.kwargs["external_id"])
        return Device.objects.for_tenant(self.request.tenant).filter(subscriber=subscriber).defer("token")

    @extend_schema(responses={200: DeviceSerializer(many=True), **errors(400, 404)})
    def list(self, request: Request, external_id: str) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response([DeviceSerializer(d).data for d in page])

    @extend_schema(request=DeviceRegistrationSerializer,
                   responses={201: DeviceSerializer, 200: DeviceSerializer, **errors(400, 404, 413)})  # fmt: skip
    def create(self, request: Request, external_id: str) -> Response:
        subscriber = self._subscriber(external_id)
        registration = _field_errors(lambda: devices.clean_registration(request.data))
        device, created = devices.register(subscriber, registration, actor=actor(request))
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(DeviceSerializer(device).data, status=code)

    @extend_schema(responses={204: None, **errors(404)})
    def destroy(self, request: Request, external_id: str, device_id: str) -> Response:
        subscriber = self._subscriber(external_id)
        if not devices.delete(subscriber, as_uuid(device_id), actor=actor(request)):
            raise NotFound()
        return Response(status=status.HTTP_204_NO_CONTENT)
