"""Saving and deleting templates: the workflows the API and the admin call (audited)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


# Whether a definition above this app (a sequence's steps) still names a template: handed in at start-up.
_users: list[Callable[[Template], bool]] = []


def check_use_with(uses: Callable[[Template], bool]) -> None:
    """Refuse deleting a template while `uses(template)` says a definition still names it."""
    if uses not in _users:
        _users.append(uses)


def delete_template(template: Template, *, actor: str) -> None:
    """Delete a template; 409 while notifications (their foreign keys PROTECT it) or sequence steps
    still use it."""
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
