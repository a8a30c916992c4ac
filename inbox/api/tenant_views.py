"""The tenant API's inbox routes: `subscribers/{external_id}/inbox-token` (issue) and `…/revoke`, and
`settings` (the origins the browser inbox answers)."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.schema import StrictSerializer, errors
from core.api.viewsets import actor
from core.models import AuditEvent
from inbox import cors, statements, tokens
from recipients.models import Subscriber


class InboxTokenRequest(StrictSerializer):
    ttl_seconds = serializers.IntegerField(required=False, min_value=1, max_value=tokens.MAX_TTL_SECONDS,
                                           help_text="Seconds the token is valid (default 86400).")  # fmt: skip


class InboxTokenResponse(serializers.Serializer):
    token = serializers.CharField()
    expires_at = serializers.DateTimeField()


class TenantSettings(StrictSerializer):
    inbox_allowed_origins = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="Browser origins (scheme://host[:port]) that /inbox/v1/ answers CORS for.",
    )  # fmt: skip


def _subscriber_exists(request: Request, external_id: str) -> None:
    if not Subscriber.objects.for_tenant(request.tenant).filter(external_id=external_id).exists():
        raise NotFound()


class InboxTokenView(APIView):
    """POST: a token for the subscriber's browser, `{"ttl_seconds"?: ≤ 604800, default 86400}` → 201."""

    @extend_schema(request=InboxTokenRequest, responses={201: InboxTokenResponse, **errors(404, 413)})
    def post(self, request: Request, external_id: str) -> Response:
        _subscriber_exists(request, external_id)
        data = request.data
        if not isinstance(data, dict):
            raise ValidationError({"non_field_errors": ["must be a JSON object"]})
        unknown = sorted(set(data) - {"ttl_seconds"})
        if unknown:
            raise ValidationError({name: ["unknown field; allowed: ttl_seconds"] for name in unknown})
        try:
            ttl = tokens.check_ttl(data.get("ttl_seconds"))
        except ValueError as exc:
            raise ValidationError({"ttl_seconds": [str(exc)]}) from None
        token, expires_at = tokens.issue(request.tenant.pk, external_id, ttl)
        return Response({"token": token, "expires_at": expires_at.isoformat().replace("+00:00", "Z")},
                        status=status.HTTP_201_CREATED)  # fmt: skip


class InboxTokenRevokeView(APIView):
    """POST: every token of the subscriber issued until now is refused from now on (204)."""

    @extend_schema(request=None, responses={204: None, **errors(404)})
    def post(self, request: Request, external_id: str) -> Response:
        _subscriber_exists(request, external_id)
        tokens.revoke(request.tenant.pk, external_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SettingsView(APIView):
    """GET/PATCH settings: `{"inbox_allowed_origins": ["https://app.example.com"]}`."""

    @extend_schema(responses={200: TenantSettings, **errors()})
    def get(self, request: Request) -> Response:
        return Response({"inbox_allowed_origins": statements.allowed_origins(request.tenant.pk)})

    @extend_schema(request=TenantSettings, responses={200: TenantSettings, **errors(413)})
    def patch(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict):
            raise ValidationError({"non_field_errors": ["must be a JSON object"]})
        unknown = sorted(set(data) - {"inbox_allowed_origins"})
        if unknown:
            raise ValidationError({name: ["unknown field; allowed: inbox_allowed_origins"] for name in unknown})
        if "inbox_allowed_origins" in data:
            try:
                origins = cors.check_origins(data["inbox_allowed_origins"])
            except ValueError as exc:
                raise ValidationError({"inbox_allowed_origins": [str(exc)]}) from None
            with transaction.atomic():
                statements.save_allowed_origins(request.tenant.pk, origins)
                AuditEvent.record(actor=actor(request), action="settings.updated", target_type="tenant_settings",
                                  target_id=request.tenant.pk, tenant=request.tenant,
                                  details={"inbox_allowed_origins": origins})  # fmt: skip
        return self.get(request)
