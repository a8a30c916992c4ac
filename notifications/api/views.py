from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class CurrentTenantView(APIView):
    """The tenant the calling API key belongs to."""

    @extend_schema(
        responses=inline_serializer("Tenant", {"id": serializers.UUIDField(), "name": serializers.CharField()})
    )
    def get(self, request: Request) -> Response:
        return Response({"id": str(request.tenant.pk), "name": request.tenant.name})
