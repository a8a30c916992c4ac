"""`Authorization: Bearer ibx_…` (an inbox token, inbox.tokens) → the subscriber it names.

Only /inbox/v1/ uses this; it never sets `request.tenant`, which the tenant API's permission asks for."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import authentication, exceptions
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from inbox import tokens


@dataclass(frozen=True)
class InboxSubscriber:
    """The principal behind an inbox token (DRF's request.user)."""

    claims: tokens.Claims
    is_authenticated: bool = True
    is_active: bool = True

    @property
    def tenant_id(self):  # noqa: ANN201
        return self.claims.tenant_id

    @property
    def external_id(self) -> str:
        return self.claims.subscriber


class InboxTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[InboxSubscriber, tokens.Claims] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.partition(" ")
        if not header or scheme.lower() != "bearer" or not raw.strip():
            raise exceptions.NotAuthenticated("Use the header `Authorization: Bearer <inbox token>`.")
        claims = tokens.verify(raw.strip())
        if claims is None:
            raise exceptions.AuthenticationFailed("The inbox token is invalid, expired or revoked.")
        request._request.inbox_subscriber = principal = InboxSubscriber(claims)
        return principal, claims

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="omnipost-inbox"'


class IsInboxSubscriber(BasePermission):
    def has_permission(self, request, view) -> bool:  # noqa: ANN001
        return isinstance(request.user, InboxSubscriber)
