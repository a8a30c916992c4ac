"""Event endpoints: create, change, delete, re-enable and recover, each audited in its transaction.

The API and the admin call these; the dispatcher's event lane (dispatch.events) delivers.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.api.errors import Conflict
from core.models import AuditEvent, Tenant
from events import statements
from events.models import DeliveryStatus, EventDelivery, EventEndpoint

SECRET_BYTES = 32
DISABLED_BY_API = "disabled through the API"


def generate_secret() -> str:
    """A Standard Webhooks secret: `whsec_` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(os.urandom(SECRET_BYTES)).decode()


def create_endpoint(
    tenant: Tenant, *, name: str, url: str, event_types: list[str], actor: str, enabled: bool = True,
    secret: str | None = None,
) -> tuple[EventEndpoint, str | None]:  # fmt: skip
    """Create an endpoint; returns it and the secret when it was generated here (shown once), or
    None when the client supplied its own (never echoed)."""
    generated = None if secret else generate_secret()
    endpoint = EventEndpoint(
        tenant=tenant, name=name, url=url, event_types=list(event_types), enabled=enabled,
        disabled_reason="" if enabled else DISABLED_BY_API, secret=secret or generated,
    )  # fmt: skip
    try:
        with transaction.atomic():
            endpoint.save()
            AuditEvent.record(
                actor=actor, action="event_endpoint.created", target=endpoint,
                details={"name": name, "url": url, "event_types": endpoint.event_types},
            )  # fmt: skip
    except IntegrityError:
        raise Conflict(f"An event endpoint named {name!r} already exists.", code="already_exists") from None
    return endpoint, generated


def update_endpoint(endpoint: EventEndpoint, changes: Mapping[str, Any], *, actor: str) -> EventEndpoint:
    """Apply a PATCH: `url`, `event_types`, `enabled`, `secret`.

    A new secret rotates: the old one signs beside it for OMNIPOST_SECRET_ROTATION_GRACE_SECONDS.
    `enabled: true` on a disabled endpoint re-enables it without re-sending: what was kept pending
    while it was disabled becomes `failed` (a `recover` sends it); `enabled: false` stops deliveries.
    """
    with transaction.atomic():
        # The row as it is now, locked: the lane may have disabled it meanwhile.
        current = EventEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        fields: list[str] = []
        for name in ("url", "event_types"):
            if name in changes and changes[name] != getattr(current, name):
                setattr(current, name, changes[name])
                fields.append(name)
        rotated = False
        if changes.get("secret") and changes["secret"] != current.secret:
            current.previous_secret = current.secret
            current.secret = changes["secret"]
            current.secret_rotated_at = timezone.now()
            fields += ["secret", "previous_secret", "secret_rotated_at"]
            rotated = True
        if "enabled" in changes and changes["enabled"] != current.enabled:
            current.enabled = changes["enabled"]
            current.disabled_reason = "" if current.enabled else DISABLED_BY_API
            current.failing_since = None
            fields += ["enabled", "disabled_reason", "failing_since"]
            if current.enabled:
                EventDelivery.objects.filter(endpoint=current, status=DeliveryStatus.PENDING).update(
                    status=DeliveryStatus.FAILED, lock_token=None, locked_until=None
                )
        if fields:
            current.save(update_fields=[*fields, "updated_at"])
            public = sorted(set(fields) - {"previous_secret", "secret_rotated_at"})
            AuditEvent.record(
                actor=actor, action="event_endpoint.updated", target=current,
                details={"name": current.name, "fields": public},
            )  # fmt: skip
            if rotated:
                AuditEvent.record(
                    actor=actor, action="event_endpoint.secret_rotated", target=current, details={"name": current.name}
                )
    return current


def delete_endpoint(endpoint: EventEndpoint, *, actor: str) -> None:
    with transaction.atomic():
        AuditEvent.record(
            actor=actor, action="event_endpoint.deleted", target=endpoint, details={"name": endpoint.name}
        )
        endpoint.delete()


class EndpointDisabled(Conflict):
    default_code = "endpoint_disabled"


def recover(endpoint: EventEndpoint, since: datetime, *, actor: str) -> int:
    """Re-send, with their original ids, the endpoint's events since `since` that it never got:
    failed deliveries become pending again, and events of its types created while it was disabled
    (or before it subscribed) get a delivery. Returns how many were queued. 409 when disabled."""
    with transaction.atomic():
        locked = EventEndpoint.objects.select_for_update().filter(pk=endpoint.pk).values_list("enabled", flat=True)
        if not locked or not locked[0]:
            raise EndpointDisabled(
                f"The event endpoint {endpoint.name!r} is disabled; PATCH it with {{\"enabled\": true}} first."
            )
        with connection.cursor() as cursor:
            cursor.execute(statements.RECOVER, {"since": since, "endpoint": endpoint.pk})
            count = cursor.rowcount
        AuditEvent.record(
            actor=actor, action="event_endpoint.recovered", target=endpoint,
            details={"name": endpoint.name, "since": since.isoformat(), "queued": count},
        )  # fmt: skip
    return count
