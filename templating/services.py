"""Saving and deleting templates: the workflows the API and the admin call (audited).

Every save that changes what a template renders (subject, body, html_body, variants) makes its next
version: `templates.version` goes up by one and the new content is copied, once, into
template_versions; a save that changes nothing makes none."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from core.api.errors import Conflict
from core.models import AuditEvent
from core.services import save_audited
from templating.models import Template, TemplateVersion

CONTENT_FIELDS = ("subject", "body", "html_body", "variants")


def save_template(template: Template, *, actor: str, fields: Sequence[str] | None = None) -> Template:
    """Save `template`, audited; a change of its content makes the next immutable version."""
    details = {"key": template.key}
    changed = False

    def lock_and_number(created: bool, _fields: list[str] | None) -> list[str]:
        nonlocal changed
        changed = created
        if not created:
            # Locked, so two saves at once make two versions one after the other.
            stored = Template.objects.select_for_update().filter(pk=template.pk).values(*CONTENT_FIELDS, "version")
            current = stored.get()
            changed = any(current[name] != getattr(template, name) for name in CONTENT_FIELDS)
            template.version = current["version"] + 1 if changed else current["version"]
        details["version"] = template.version
        return ["version"]

    def keep_version(_created: bool) -> None:
        if changed:
            TemplateVersion.objects.create(
                tenant_id=template.tenant_id, template=template, version=template.version,
                **{name: getattr(template, name) for name in CONTENT_FIELDS}, actor=actor[:200],
            )  # fmt: skip

    def conflict(_: IntegrityError) -> Conflict:
        return Conflict(f"A template named {template.key!r} already exists.", code="already_exists")

    return save_audited(template, actor=actor, noun="template", details=details, fields=fields,
                        conflict=conflict, before=lock_and_number, after=keep_version)  # fmt: skip


# Whether a definition above this app (a sequence's steps) still names a template: handed in at start-up.
_users: list[Callable[[Template], bool]] = []


def check_use_with(uses: Callable[[Template], bool]) -> None:
    """Refuse deleting a template while `uses(template)` says a definition still names it."""
    if uses not in _users:
        _users.append(uses)


def delete_template(template: Template, *, actor: str) -> None:
    """Delete a template (and its versions); 409 while notifications (their foreign keys PROTECT it)
    or sequence steps still use it."""
    try:
        if any(uses(template) for uses in _users):
            raise ProtectedError("named by a sequence's steps", set())
        with transaction.atomic():
            AuditEvent.record(actor=actor, action="template.deleted", target=template, details={"name": template.key})
            template.delete()
    except ProtectedError:
        raise Conflict(
            f"The template {template.key!r} is still used by notifications or sequence steps and cannot be deleted.",
            code="template_in_use",
        ) from None
