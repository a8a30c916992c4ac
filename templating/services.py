"""Saving and deleting templates: the workflows the API and the admin call (audited).

Every save that changes what a template renders (subject, body, html_body, variants) makes its next
version: `templates.version` goes up by one and the new content is copied, once, into
template_versions; a save that changes nothing makes none."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from core.api.errors import Conflict
from core.models import AuditEvent
from templating.models import Template, TemplateVersion

CONTENT_FIELDS = ("subject", "body", "html_body", "variants")


def save_template(template: Template, *, actor: str, fields: Sequence[str] | None = None) -> Template:
    created = template._state.adding
    try:
        with transaction.atomic():
            changed = created
            if not created:
                # Locked, so two saves at once make two versions one after the other.
                stored = Template.objects.select_for_update().filter(pk=template.pk).values(*CONTENT_FIELDS, "version")
                current = stored.get()
                changed = any(current[name] != getattr(template, name) for name in CONTENT_FIELDS)
                template.version = current["version"] + 1 if changed else current["version"]
            update = None if created or fields is None else [*fields, "version", "updated_at"]
            template.save(update_fields=update)
            if changed:
                TemplateVersion.objects.create(
                    tenant_id=template.tenant_id, template=template, version=template.version,
                    **{name: getattr(template, name) for name in CONTENT_FIELDS}, actor=actor[:200],
                )  # fmt: skip
            AuditEvent.record(
                actor=actor, action="template.created" if created else "template.updated", target=template,
                details={"key": template.key, "fields": sorted(fields or []), "version": template.version},
            )  # fmt: skip
    except IntegrityError:
        raise Conflict(f"A template named {template.key!r} already exists.", code="already_exists") from None
    return template


def delete_template(template: Template, *, actor: str) -> None:
    """Delete a template (and its versions); 409 while notifications or sequence steps still use it
    (their foreign keys PROTECT it)."""
    try:
        with transaction.atomic():
            AuditEvent.record(actor=actor, action="template.deleted", target=template, details={"name": template.key})
            template.delete()
    except ProtectedError:
        raise Conflict(
            f"The template {template.key!r} is still used by notifications or sequence steps and cannot be deleted.",
            code="template_in_use",
        ) from None
