"""The provider an inbound URL names, as adapters see it (`ProviderView`), cached per process.

A vendor posts to `/hooks/providers/{id}` at whatever rate its traffic has, so the provider row (and
the Fernet decryption of its secrets) is not read for every request: each process keeps the views
it built, keyed by id. A cached view is checked, not trusted: `apply_receipts` stores nothing unless
the provider's `updated_at` is still the view's (one condition inside its one statement), and a
request the cached view rejects is verified once more against a fresh read. So an edited or rotated
secret takes effect for the next request in every process, and a steady stream costs no query of
its own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

from django.conf import settings

from providers.models import Provider
from receipts.inbound import ProviderView

MAX_CACHED = 10_000


@dataclass(frozen=True, slots=True)
class _Entry:
    view: ProviderView  # previous secrets included
    previous_until: float  # epoch seconds; after it the previous secrets no longer verify


_cache: OrderedDict[int, _Entry] = OrderedDict()
_lock = threading.Lock()


def _build(provider: Provider) -> _Entry:
    previous: tuple = ()
    until = 0.0
    if provider.previous_secrets and provider.secrets_rotated_at is not None:
        until = provider.secrets_rotated_at.timestamp() + float(settings.OMNIPOST_SECRET_ROTATION_GRACE_SECONDS)
        previous = (dict(provider.previous_secrets),)
    view = ProviderView(
        id=provider.pk, tenant_id=str(provider.tenant_id), kind=provider.kind, config=dict(provider.config or {}),
        secrets=dict(provider.secrets or {}), previous_secrets=previous, updated_at=provider.updated_at,
        name=provider.name,
    )  # fmt: skip
    return _Entry(view, until)


def _usable(entry: _Entry) -> ProviderView:
    """The view with its previous secrets only while the rotation grace lasts."""
    if entry.view.previous_secrets and time.time() >= entry.previous_until:
        return replace(entry.view, previous_secrets=())
    return entry.view


def load(provider_id: int) -> ProviderView | None:
    """Read the provider afresh (one query) and cache its view; None if there is no such provider."""
    provider = Provider.objects.filter(pk=provider_id).first()
    if provider is None:
        forget(provider_id)
        return None
    entry = _build(provider)
    with _lock:
        _cache[provider_id] = entry
        _cache.move_to_end(provider_id)
        while len(_cache) > MAX_CACHED:
            _cache.popitem(last=False)
    return _usable(entry)


def cached(provider_id: int) -> ProviderView | None:
    with _lock:
        entry = _cache.get(provider_id)
        if entry is not None:
            _cache.move_to_end(provider_id)
    return _usable(entry) if entry is not None else None


def get(provider_id: int) -> tuple[ProviderView | None, bool]:
    """(view, fresh): the cached view (fresh=False) or one read now."""
    view = cached(provider_id)
    if view is not None:
        return view, False
    return load(provider_id), True


def forget(provider_id: int) -> None:
    with _lock:
        _cache.pop(provider_id, None)


def clear() -> None:
    with _lock:
        _cache.clear()
