"""A tenant's providers, templates and categories as creates need them, cached in each web process.

Every change to a tenant's providers, templates or categories bumps `Tenant.config_version` in the change's
own transaction (the signals below, so the API, the admin and plain ORM saves alike). A create
resolves names from this cache, and its one INSERT statement stores only while the version the
cache was read at is still the tenant's (`services.create_notifications(config_version=…)`
checks it inside that statement). So a provider edit takes effect for the next create in every
process, a stale cache costs one reload and one re-run, and an unchanged configuration costs
no query at all. A name the cache does not know (a 400) is looked up afresh before it is refused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from core.models import Tenant
from providers.models import Provider
from recipients.models import Category
from templating.models import Template

MAX_TENANTS = 10_000  # tenants cached per process (least recently used dropped first)
MAX_TEMPLATES = 1_000  # template keys cached per tenant; past it, lookups still work, uncached


@dataclass(slots=True)
class TenantConfig:
    version: int
    providers: dict[str, Provider]
    defaults: dict[str, Provider]  # channel → where a notification that names no provider starts
    templates: dict[str, Template | None] = field(default_factory=dict)  # None: known to be missing
    categories: dict[str, Category] = field(default_factory=dict)  # stored ones (`general` may not be)


_cache: OrderedDict[Any, TenantConfig] = OrderedDict()
_lock = threading.Lock()


def first_choices(providers: Iterable[Provider]) -> dict[str, Provider]:
    """Channel → the provider a notification that names none starts at: the lowest `failover_order`
    of the channel (ties by name), else the channel's default."""
    chosen: dict[str, Provider] = {}
    for p in providers:
        current = chosen.get(p.channel)
        if p.failover_order is not None:
            if current is None or current.failover_order is None or (p.failover_order, p.name) < (
                current.failover_order, current.name
            ):
                chosen[p.channel] = p
        elif p.is_default and current is None:
            chosen[p.channel] = p
    return chosen


def load(tenant_id: Any) -> TenantConfig:
    """Read the tenant's version, providers and categories (three queries). The version is read first: an edit
    between the two reads leaves the snapshot older than its version says, which the next
    create's check catches."""
    version = Tenant.objects.filter(pk=tenant_id).values_list("config_version", flat=True).first() or 0
    providers: dict[str, Provider] = {}
    defaults: dict[str, Provider] = {}
    for provider in Provider.objects.for_tenant(tenant_id):
        providers[provider.name] = provider
    defaults.update(first_choices(providers.values()))
    categories = {c.key: c for c in Category.objects.for_tenant(tenant_id)}
    config = TenantConfig(version=version, providers=providers, defaults=defaults, categories=categories)
    with _lock:
        _cache[tenant_id] = config
        _cache.move_to_end(tenant_id)
        while len(_cache) > MAX_TENANTS:
            _cache.popitem(last=False)
    return config


def get(tenant_id: Any) -> TenantConfig | None:
    """The cached configuration, or None."""
    with _lock:
        config = _cache.get(tenant_id)
        if config is not None:
            _cache.move_to_end(tenant_id)
        return config


def templates(config: TenantConfig, tenant_id: Any, keys: Iterable[str]) -> dict[str, Template]:
    """The templates named `keys` that exist; one query for the keys not cached yet."""
    keys = set(keys)
    missing = {key for key in keys if key not in config.templates}  # no iteration of a dict another thread fills
    if missing:
        found = {t.key: t for t in Template.objects.for_tenant(tenant_id).filter(key__in=missing)}
        with _lock:
            if len(config.templates) + len(missing) <= MAX_TEMPLATES:
                config.templates.update({key: found.get(key) for key in missing})
        resolved = {key: config.templates.get(key) for key in keys - missing}
        resolved.update(found)
    else:
        resolved = {key: config.templates[key] for key in keys}
    return {key: t for key, t in resolved.items() if t is not None}


def category_keys(tenant: Tenant) -> frozenset[str]:
    """The tenant's stored category keys, from this process's copy (what recipients.services reads)."""
    config = get(tenant.pk) or load(tenant.pk)
    return frozenset(config.categories)


def forget(tenant_id: Any) -> None:
    with _lock:
        _cache.pop(tenant_id, None)


def clear() -> None:
    with _lock:
        _cache.clear()


def bump(tenant_id: Any) -> None:
    """Make every process's cached configuration of the tenant stale (in the caller's transaction)."""
    Tenant.objects.filter(pk=tenant_id).update(config_version=F("config_version") + 1)
    forget(tenant_id)
    transaction.on_commit(lambda: forget(tenant_id))  # a create in between may have re-read the old one


@receiver(post_save, sender=Provider, dispatch_uid="tenant_config.provider_saved")
@receiver(post_delete, sender=Provider, dispatch_uid="tenant_config.provider_deleted")
@receiver(post_save, sender=Template, dispatch_uid="tenant_config.template_saved")
@receiver(post_delete, sender=Template, dispatch_uid="tenant_config.template_deleted")
@receiver(post_save, sender=Category, dispatch_uid="tenant_config.category_saved")
@receiver(post_delete, sender=Category, dispatch_uid="tenant_config.category_deleted")
def _changed(sender: type, instance: Provider | Template | Category, **kwargs: Any) -> None:
    if kwargs.get("raw"):  # loaddata
        return
    bump(instance.tenant_id)
