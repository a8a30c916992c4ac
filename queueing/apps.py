from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_save


class QueueingConfig(AppConfig):
    name = "queueing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core.api import throttling
        from core.models import Tenant
        from queueing.ratelimit import take_key

        throttling.use_bucket(take_key)  # core's API throttle spends the queue's token buckets

        # A tenant is saved by the admin (core knows nothing of the queue): its limit, set or
        # removed, re-decides its queued items in the same transaction. A lane's own limit is its
        # owner's to record (queue.set_lane_limit: providers.lanes, for providers).
        post_save.connect(_tenant_saved, sender=Tenant, dispatch_uid="queueing.tenant_rate_limit")


def _tenant_saved(sender: type, instance: Any, created: bool, update_fields: Any = None, **kwargs: Any) -> None:  # noqa: ANN401
    if created or (update_fields is not None and "rate_per_second" not in update_fields):
        return
    from queueing.queue import sync_rate_limited

    sync_rate_limited(tenant_ids=[instance.pk], using=kwargs.get("using") or "default")
