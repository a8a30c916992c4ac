"""Helpers shared by the management commands."""

from __future__ import annotations

import uuid

from django.core.management.base import CommandError

from core.models import Tenant


def resolve_tenant(ref: str) -> Tenant:
    """A tenant by id or by name, or a one-line CommandError."""
    try:
        return Tenant.objects.get(pk=uuid.UUID(ref))
    except (ValueError, Tenant.DoesNotExist):
        pass
    try:
        return Tenant.objects.get(name=ref)
    except Tenant.DoesNotExist:
        raise CommandError(f"no tenant with id or name {ref!r}") from None
