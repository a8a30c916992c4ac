"""The dispatcher's provider instances, checked against their rows at every claim.

An edit or a secret rotation takes effect for the next claim: the claim statement reads the claimed
providers' `updated_at` (a failover to another provider: one statement more) and only the providers
that changed are built again. A replaced instance is not closed at once:
its sends in flight finish on it (its connections drain), then it is closed on the event loop.

The cache is bounded (OMNIPOST_DISPATCHER_PROVIDER_CACHE instances, each with its HTTP pool): past
the bound, the least recently claimed providers with no send in flight are dropped and closed. A
provider whose row is gone (deleted, or its tenant) is dropped when a claim or the sweep (every
`SWEEP_SECONDS`, dispatch.upkeep) finds it missing (or, with sends in flight, when the last of them
ends) and closed once they are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from core import pooling
from dispatch.delivery import Prepared, hot_cursor
from providers.kinds import BaseProvider, DeliveryResult, OutboundMessage, build_provider
from providers.models import Provider
from providers.scrub import secret_values
from queueing import ratelimit

logger = logging.getLogger("omnipost.dispatcher")

SWEEP_SECONDS = 30.0  # how often the dispatcher looks for cached providers whose row is gone


@dataclass
class CachedProvider:
    instance: BaseProvider | MisconfiguredProvider
    row_updated_at: datetime  # compared with the row's at every claim: an edit takes effect at the next
    max_attempts: int
    limited: bool
    loaded_at: float = 0.0  # the dispatcher's clock when this instance was built
    secrets: tuple[str, ...] = ()  # scrubbed from error texts (providers.scrub)


class MisconfiguredProvider:
    """Stands in for a provider whose stored configuration cannot be used: each send fails
    permanently with `invalid_config` (to the DLQ, visible to operators) instead of stopping
    the dispatcher for every other tenant."""

    def __init__(self, problem: str) -> None:
        self.problem = problem

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        return DeliveryResult(delivered=False, error_code="invalid_config", permanent=True, message=self.problem)

    def start_send(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> None:
        return None  # awaited in a task: a send that fails at once is no hot path

    async def aclose(self) -> None:
        return None


def instantiate(row: Provider) -> BaseProvider | MisconfiguredProvider:
    try:
        # provider_id: for kinds whose sends name their provider (SMTP's VERP return path, Twilio's StatusCallback)
        return build_provider(row.kind, row.config, row.secrets, provider_id=row.pk, **row.rotation_options())
    except Exception as exc:  # noqa: BLE001 - any bad stored config must not stop the dispatcher
        logger.error("provider %s (%s) is misconfigured: %s", row.pk, row.kind, exc)
        return MisconfiguredProvider(f"provider configuration is invalid: {type(exc).__name__}")


# Once per claim: which of its providers changed since they were loaded (raw, through the hot path's
# prepared cursor: ≈ 0.1 ms a claim against ≈ 0.35 ms through the ORM).
_PROVIDER_VERSIONS = "SELECT id, updated_at FROM providers WHERE id = ANY(%s)"


def provider_versions(provider_ids: set[int]) -> dict[int, datetime]:
    """`updated_at` of each of these providers, in one statement."""
    with hot_cursor("default") as cursor:
        cursor.execute(_PROVIDER_VERSIONS, [list(provider_ids)], prepare=pooling.prepare())
        return dict(cursor.fetchall())


class ProviderCache:
    """`entries` by provider id, least recently claimed first; `inflight` (item id → (handle, item))
    is filled by the sender and read here to know which sends a replaced instance still carries;
    `sending` counts the sends in flight by provider id (the sender's, on the event loop).

    `entries` is changed on the DB thread (`load`, `sweep`), between claims: the event loop starts a
    claim's sends before it asks for the next claim, so an entry with no send counted in `sending`
    and not in the claim being loaded is not about to be used. The one change on the event loop:
    the entry of a provider whose row is gone, at the end of its last send (`drained`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, size: int | None = None) -> None:
        self.entries: dict[int, CachedProvider] = {}
        self.inflight: dict[int, tuple[Any, Prepared]] = {}
        self.sending: Counter[int] = Counter()
        self.size = max(1, settings.OMNIPOST_DISPATCHER_PROVIDER_CACHE if size is None else size)
        self.clock = clock
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the dispatcher; None: nothing to retire on
        self._retiring: list[tuple[BaseProvider | MisconfiguredProvider, set[int]]] = []
        self._closing: set[asyncio.Task] = set()
        self._gone: set[int] = set()  # rows gone, entries kept until their sends in flight end

    def load(self, provider_ids: set[int], known: dict[int, datetime | None] | None = None) -> None:
        """On the DB thread: the claimed items' providers as they are now (`known`: the versions the
        claim statement read, None for a row gone; one statement for the others, those routing moved
        items to, and one more for those that changed); past the bound, the least recently claimed
        idle ones dropped."""
        if not provider_ids:
            return
        known = known or {}
        versions = {pid: v for pid in provider_ids if (v := known.get(pid)) is not None}
        if rest := {pid for pid in provider_ids if pid not in known}:
            versions.update(provider_versions(rest))
        cache = self.entries
        for pid in provider_ids:  # the most recently claimed last
            if pid not in versions:  # its row is gone: nothing is built for it
                if pid in cache:
                    self._forget(pid)
            elif (cached := cache.pop(pid, None)) is not None:
                cache[pid] = cached
        stale = {pid for pid in versions if (c := cache.get(pid)) is None or c.row_updated_at != versions[pid]}
        if stale:
            for row in Provider.objects.filter(pk__in=stale).select_related("tenant"):
                replaced = cache.pop(row.pk, None)
                cache[row.pk] = CachedProvider(
                    instance=instantiate(row),
                    row_updated_at=row.updated_at,
                    max_attempts=row.max_attempts or settings.OMNIPOST_MAX_ATTEMPTS,
                    limited=ratelimit.is_limited(row.rate_per_second, row.tenant.rate_per_second),
                    loaded_at=self.clock(),
                    secrets=secret_values(row.secrets) + secret_values(row.previous_secrets),
                )
                if replaced is not None and self.loop is not None:
                    self.loop.call_soon_threadsafe(self._retire, row.pk, replaced.instance)
        if len(cache) > self.size:
            self._evict(len(cache) - self.size, keep=provider_ids)

    def sweep(self) -> int:
        """On the DB thread: drop the cached providers whose row is gone (one statement); how many."""
        if not self.entries:
            return 0
        versions = provider_versions(set(self.entries))
        gone = [pid for pid in list(self.entries) if pid not in versions]
        for pid in gone:
            self._forget(pid)
        return len(gone)

    def _forget(self, provider_id: int) -> None:
        """A provider whose row is gone: dropped now if it is idle, else when its last send in flight
        ends (`drained`), so that send is still judged with its entry (attempts, secrets scrubbed)."""
        if self.sending.get(provider_id):
            self._gone.add(provider_id)
        elif (cached := self.entries.pop(provider_id, None)) is not None:
            self._drop(provider_id, cached, "its row is gone")

    def _evict(self, over: int, keep: set[int]) -> None:
        """Drop `over` entries, least recently claimed first, never one with sends in flight nor
        one of the claim being loaded (the bound is then exceeded until they are idle)."""
        for pid in list(self.entries):
            if over <= 0:
                return
            if pid in keep or self.sending.get(pid):
                continue
            self._drop(pid, self.entries.pop(pid), "least recently used")
            over -= 1

    def _drop(self, provider_id: int, cached: CachedProvider, why: str) -> None:
        logger.info("provider %s dropped from the cache (%s)", provider_id, why)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._retire, provider_id, cached.instance)

    def started(self, provider_id: int) -> None:
        """On the event loop: a send through this provider is in flight."""
        self.sending[provider_id] += 1

    def max_attempts(self, provider_id: int) -> int:
        cached = self.entries.get(provider_id)
        return cached.max_attempts if cached else settings.OMNIPOST_MAX_ATTEMPTS

    def secrets(self, provider_id: int) -> tuple[str, ...]:
        cached = self.entries.get(provider_id)
        return cached.secrets if cached else ()

    def limited(self, provider_id: int | None) -> bool:
        cached = self.entries.get(provider_id)  # type: ignore[arg-type]
        return bool(cached and cached.limited)

    def _retire(self, provider_id: int, instance: BaseProvider | MisconfiguredProvider) -> None:
        """On the event loop: close a replaced instance once the sends it has in flight are done."""
        waiting = {item_id for item_id, (_, item) in self.inflight.items() if item.provider_id == provider_id}
        if waiting:
            self._retiring.append((instance, waiting))
        else:
            self._close_later(instance)

    def drained(self, item_id: int, provider_id: int | None = None) -> None:
        """A send ended (or was given back; its outcome judged): its provider may be evicted now;
        close the replaced instances it was the last of."""
        if provider_id is not None:
            if (left := self.sending[provider_id] - 1) > 0:
                self.sending[provider_id] = left
            else:
                self.sending.pop(provider_id, None)
                if provider_id in self._gone:  # its row is gone and this was its last send
                    self._gone.discard(provider_id)
                    if (cached := self.entries.pop(provider_id, None)) is not None:
                        logger.info("provider %s dropped from the cache (its row is gone)", provider_id)
                        self._retire(provider_id, cached.instance)
        for entry in list(self._retiring):  # a few at most: providers edited while they were sending
            entry[1].discard(item_id)
            if not entry[1]:
                self._retiring.remove(entry)
                self._close_later(entry[0])

    def _close_later(self, instance: BaseProvider | MisconfiguredProvider) -> None:
        task = asyncio.get_running_loop().create_task(instance.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        for instance in [c.instance for c in self.entries.values()] + [i for i, _ in self._retiring]:
            with contextlib.suppress(Exception):
                await instance.aclose()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
