"""A provider is a lane of the queue: its `rate_limit` is recorded in queueing's `lane_limits`, from
which the queue decides whether a new item is rate-limited (it reads no table above it).

Kept in sync on every save and delete of a provider (the API's and the admin's, through
`services.save_provider`, and any other `save()`), in the save's transaction, together with the
provider's queued items (`queue.set_lane_limit` re-decides them). An `update()` of
`rate_per_second` or `burst` bypasses the signals: save the provider instead.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save

from providers.models import Provider
from queueing import queue

LIMIT_FIELDS = frozenset({"rate_per_second", "burst"})


def provider_saved(sender: type, instance: Provider, created: bool, update_fields: Any = None, **kwargs: Any) -> None:  # noqa: ANN401
    if update_fields is not None and not LIMIT_FIELDS.intersection(update_fields):
        return
    if created and instance.rate_per_second is None:
        return  # a new lane without a limit: no row, and no items yet
    queue.set_lane_limit(
        instance.pk, tenant_id=instance.tenant_id, rate_per_second=instance.rate_per_second, burst=instance.burst,
        using=kwargs.get("using") or "default",
    )  # fmt: skip


def provider_deleted(sender: type, instance: Provider, **kwargs: Any) -> None:  # noqa: ANN401
    queue.set_lane_limit(instance.pk, tenant_id=instance.tenant_id, rate_per_second=None,
                         using=kwargs.get("using") or "default")  # fmt: skip


def connect() -> None:
    post_save.connect(provider_saved, sender=Provider, dispatch_uid="providers.lanes.saved")
    post_delete.connect(provider_deleted, sender=Provider, dispatch_uid="providers.lanes.deleted")
