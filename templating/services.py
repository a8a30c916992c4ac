"""Saving and deleting templates: the workflows the API and the admin call (audited)."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from core.api.errors import Conflict
from core.models import AuditEvent
from templating.models import Template


def save_template(template: Template, *, actor: str, fields: Sequence[str] | None = None) -> Template:
    created = template._state.adding
    try:
        with transaction.atomic():
            template.save(update_fields=None if created or fields is None else [*fields, "updated_at"])
            AuditEvent.record(
                actor=actor, action="template.created" if created else "template.updated", target=template,
                details={"key": template.key, "fields": sorted(fields or [])},
            )  # fmt: skip
    except IntegrityError:
        raise Conflict(f"A template named {template.key!r} already exists.", code="already_exists") from None
    return template


def delete_template(template: Template, *, actor: str) -> None:
    """Delete a template; 409 while notifications or sequence steps still use it (their foreign keys
    PROTECT it)."""
    try:
        with transaction.atomic():
            AuditEvent.record(actor=actor, action="template.deleted", target=template, details={"name": template.key})
            template.delete()
    except ProtectedError:
        raise Conflict(
            f"The template {template.key!r} is still used by notifications or sequence steps and cannot be deleted.",
            code="template_in_use",
        ) from None
