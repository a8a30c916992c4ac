"""`Authorization: Bearer op_<prefix>_<secret>` → request.tenant."""

from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from core.models import ApiKey, Tenant


@dataclass(frozen=True)
class ApiClient:
    """The principal behind an API key (DRF's request.user)."""

    tenant: Tenant
    key: ApiKey
    is_authenticated: bool = True
    is_active: bool = True

    @property
    def actor(self) -> str:
        return f"api_key:{self.key.prefix}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiClient, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw_key = header.partition(" ")
        if scheme.lower() != "bearer" or not raw_key.strip():
            raise exceptions.AuthenticationFailed("Use the header `Authorization: Bearer <api key>`.")
        key = ApiKey.authenticate(raw_key.strip())
        if key is None:
            raise exceptions.AuthenticationFailed("The API key is invalid or has been revoked.")
        request._request.tenant = key.tenant
        return ApiClient(tenant=key.tenant, key=key), key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="omnipost"'


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "core.api.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):  # noqa: ANN001, ANN201
        return {"type": "http", "scheme": "bearer", "bearerFormat": "op_<prefix>_<secret>"}
