"""Saving and deleting templates: the workflows the API and the admin call (audited)."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from core.api.errors import Conflict
from core.models import AuditEvent
from core.services import save_audited
from templating.models import Template


def save_template(template: Template, *, actor: str, fields: Sequence[str] | None = None) -> Template:
    def conflict(_: IntegrityError) -> Conflict:
        return Conflict(f"A template named {template.key!r} already exists.", code="already_exists")

    return save_audited(template, actor=actor, noun="template", details={"key": template.key}, fields=fields,
                        conflict=conflict)  # fmt: skip


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
