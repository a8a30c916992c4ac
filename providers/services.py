"""Saving and deleting providers: the workflows the API and the admin call (audited).

Making a provider the channel's default unsets the previous default in the same transaction; a
changed rate limit re-decides the provider's queued items (providers.lanes, on save); a
rotated rotating secret (a webhook's signing_secret) is kept beside the new one for the grace period."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.db.models.functions import Now
from django.utils import timezone

from core.api.errors import Conflict
from core.models import AuditEvent
from core.services import save_audited
from providers.models import Provider


def _duplicate(exc: IntegrityError, name: str) -> Conflict:
    if "provider_one_default_per_channel" in str(exc):
        return Conflict(
            "Another request changed this channel's default provider at the same time; retry.", code="conflict"
        )
    return Conflict(f"A provider named {name!r} already exists.", code="already_exists")


def save_provider(provider: Provider, *, actor: str, fields: Sequence[str] | None = None) -> Provider:
    """Create or update a provider. Making it the default unsets the channel's previous default in
    the same transaction; the partial unique index settles a race between two new defaults (409)."""

    def before(created: bool, fields: list[str] | None) -> list[str]:
        if provider.is_default:
            old = Provider.objects.for_tenant(provider.tenant_id).filter(channel=provider.channel, is_default=True)
            old.exclude(pk=provider.pk).update(is_default=False, updated_at=Now())
        if not created and fields is not None and "secrets" in fields:
            return _note_rotation(provider)
        return []

    # Its rate limit, and the lanes of its queued items, follow in the save's transaction (providers.lanes).
    return save_audited(provider, actor=actor, noun="provider", details={"name": provider.name}, fields=fields,
                        conflict=lambda exc: _duplicate(exc, provider.name), before=before)  # fmt: skip


def _note_rotation(provider: Provider) -> list[str]:
    """Keep the values of the kind's rotating secrets (a webhook's signing_secret) that this save
    replaces, and when: they sign beside the new ones for OMNIPOST_SECRET_ROTATION_GRACE_SECONDS.
    Returns the fields to save as well (none when no such secret changed). A second rotation
    within the grace keeps only the secret it replaced."""
    from providers.kinds import provider_class  # the kinds are loaded only when needed

    rotating = provider_class(provider.kind).rotating_secrets
    if not rotating:
        return []
    stored = Provider.objects.select_for_update().only("secrets").get(pk=provider.pk).secrets or {}
    new = provider.secrets or {}
    replaced = {k: stored[k] for k in rotating if stored.get(k) and stored.get(k) != new.get(k)}
    if not replaced:
        return []
    provider.previous_secrets = replaced
    provider.secrets_rotated_at = timezone.now()
    return ["previous_secrets", "secrets_rotated_at"]


def delete_provider(provider: Provider, *, actor: str) -> None:
    """Delete a provider; 409 while notifications still use it (their foreign key PROTECTs it)."""
    try:
        with transaction.atomic():
            AuditEvent.record(actor=actor, action="provider.deleted", target=provider, details={"name": provider.name})
            provider.delete()
    except ProtectedError:
        raise Conflict(
            f"The provider {provider.name!r} is still used by notifications and cannot be deleted.",
            code="provider_in_use",
        ) from None


INBOX_PROVIDER_NAME = "inbox"


def ensure_inbox_provider(tenant_id: object) -> Provider | None:
    """The tenant's built-in `inbox` provider (the in_app channel's default), created on the first
    in_app notification rather than by a data migration, so tenants created later need no hook.
    None if the tenant already holds the name `inbox` for another channel (its in_app notifications
    then need a provider named explicitly)."""
    try:
        with transaction.atomic():
            provider, _ = Provider.objects.get_or_create(
                tenant_id=tenant_id, name=INBOX_PROVIDER_NAME,
                defaults={"channel": "in_app", "kind": "inbox", "is_default": True, "config": {}, "secrets": {}},
            )  # fmt: skip
    except IntegrityError:  # a concurrent first in_app notification made it (or another in_app default exists)
        provider = Provider.objects.for_tenant(tenant_id).filter(name=INBOX_PROVIDER_NAME).first()
    return provider if provider is not None and provider.channel == "in_app" else None
