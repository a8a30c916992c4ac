from __future__ import annotations

from rest_framework.permissions import BasePermission


class IsTenantAuthenticated(BasePermission):
    """Every API view needs a valid key; the view then scopes with `for_tenant(request.tenant)`."""

    def has_permission(self, request, view) -> bool:  # noqa: ANN001
        return getattr(request._request, "tenant", None) is not None
