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
    missing = "Use the header `Authorization: Bearer <inbox token>`."

    def raw_token(self, request: Request) -> str:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.partition(" ")
        return raw.strip() if scheme.lower() == "bearer" else ""

    def authenticate(self, request: Request) -> tuple[InboxSubscriber, tokens.Claims] | None:
        raw = self.raw_token(request)
        if not raw:
            raise exceptions.NotAuthenticated(self.missing)
        claims = tokens.verify(raw)
        if claims is None:
            raise exceptions.AuthenticationFailed("The inbox token is invalid, expired or revoked.")
        request._request.inbox_subscriber = principal = InboxSubscriber(claims)
        return principal, claims

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="omnipost-inbox"'


class StreamTokenAuthentication(InboxTokenAuthentication):
    """As the stream takes its token: the header, or `?token=` (EventSource sends no headers)."""

    missing = "Use `Authorization: Bearer <inbox token>` or `?token=`."

    def raw_token(self, request: Request) -> str:
        return super().raw_token(request) or request.query_params.get("token", "").strip()


class IsInboxSubscriber(BasePermission):
    def has_permission(self, request, view) -> bool:  # noqa: ANN001
        return isinstance(request.user, InboxSubscriber)
