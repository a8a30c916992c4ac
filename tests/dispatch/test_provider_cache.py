"""The dispatcher's provider cache is bounded and forgets deleted providers: past its size the least
recently claimed providers with no send in flight are dropped and their instances (HTTP pools)
closed; a provider whose row is gone is dropped at the next claim that names it or at the sweep,
and its instance closed once its sends in flight are done."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from django.db import connection

from dispatch.dispatcher import Dispatcher, DispatcherConfig
from dispatch.providers import ProviderCache
from notifications.models import Notification
from providers.models import Provider
from tests import factories
from tests.queueing.dispatch_support import wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = pytest.mark.django_db(transaction=True)


def on_db_thread(fn, *args):  # noqa: ANN001, ANN202 - its own connection, closed after
    try:
        return fn(*args)
    finally:
        connection.close()


def hooks(tenant, count: int) -> list[Provider]:  # noqa: ANN001
    return [hook(tenant, f"hook-{i}", "http://127.0.0.1:9/hook") for i in range(count)]


def hook(tenant, name: str, url: str) -> Provider:  # noqa: ANN001
    return factories.provider(tenant, name, config={"url": url}, secrets={"signing_secret": TEST_SIGNING_SECRET})


def closed(instance) -> bool:  # noqa: ANN001
    return instance._client._closed


async def settle() -> None:
    """Let the loop run what the DB thread handed it (retirements) and the closes they start."""
    for _ in range(5):
        await asyncio.sleep(0.01)


def test_the_bound_holds_over_many_providers_and_entries_with_sends_in_flight_stay(tenant_a):
    rows = hooks(tenant_a, 12)
    ids = [p.pk for p in rows]

    async def scenario() -> None:
        cache = ProviderCache(size=4)
        cache.loop = asyncio.get_running_loop()
        await asyncio.to_thread(on_db_thread, cache.load, {ids[0], ids[1]})
        busy = {pid: cache.entries[pid].instance for pid in ids[:2]}
        cache.started(ids[0])  # a send through each of the first two is in flight
        cache.started(ids[1])
        instances = dict(busy)
        for pid in ids[2:]:  # one claim each
            await asyncio.to_thread(on_db_thread, cache.load, {pid})
            instances[pid] = cache.entries[pid].instance
            assert len(cache.entries) <= 4
        await settle()
        # the two in flight were never evicted; the least recently claimed idle ones were
        assert list(cache.entries) == [ids[0], ids[1], ids[10], ids[11]]
        assert not any(closed(i) for i in busy.values())
        assert all(closed(instances[pid]) for pid in ids[2:10])
        assert not closed(instances[ids[10]]) and not closed(instances[ids[11]])

        # their sends end: the next claim may evict them, least recently claimed first
        cache.drained(1, ids[0])
        cache.drained(2, ids[1])
        assert cache.sending == {}
        await asyncio.to_thread(on_db_thread, cache.load, {ids[2]})
        await settle()
        assert list(cache.entries) == [ids[1], ids[10], ids[11], ids[2]]
        assert closed(busy[ids[0]]) and not closed(busy[ids[1]])
        await cache.aclose()

    asyncio.run(scenario())


def test_a_claim_with_more_providers_than_the_bound_keeps_them_all_until_the_next(tenant_a):
    ids = [p.pk for p in hooks(tenant_a, 6)]

    async def scenario() -> None:
        cache = ProviderCache(size=2)
        cache.loop = asyncio.get_running_loop()
        await asyncio.to_thread(on_db_thread, cache.load, set(ids))
        assert set(cache.entries) == set(ids), "each item of the claim finds its provider's instance"
        await asyncio.to_thread(on_db_thread, cache.load, {ids[0]})
        assert len(cache.entries) == 2 and ids[0] in cache.entries
        await cache.aclose()

    asyncio.run(scenario())


def test_a_deleted_provider_is_dropped_and_closed_once_its_sends_in_flight_are_done(tenant_a):
    kept, deleted, other = hooks(tenant_a, 3)

    async def scenario() -> None:
        cache = ProviderCache(size=10)
        cache.loop = asyncio.get_running_loop()
        await asyncio.to_thread(on_db_thread, cache.load, {kept.pk, deleted.pk, other.pk})
        gone, dropped_at_claim = cache.entries[deleted.pk].instance, cache.entries[other.pk].instance
        cache.inflight[7] = (None, SimpleNamespace(provider_id=deleted.pk))  # one send still on the wire
        cache.started(deleted.pk)
        await asyncio.to_thread(on_db_thread, lambda: Provider.objects.filter(pk__in=[deleted.pk, other.pk]).delete())

        # the sweep finds both rows gone: the idle one dropped and closed at once; the other kept
        # until its send ends (judged with its entry: attempts, secrets scrubbed), then closed
        assert await asyncio.to_thread(on_db_thread, cache.sweep) == 2
        await settle()
        assert set(cache.entries) == {kept.pk, deleted.pk}
        assert closed(dropped_at_claim), "no send in flight: closed at once"
        assert not closed(gone), "its send in flight finishes on it"
        del cache.inflight[7]
        cache.drained(7, deleted.pk)
        await settle()
        assert set(cache.entries) == {kept.pk}
        assert closed(gone) and not closed(cache.entries[kept.pk].instance)
        assert await asyncio.to_thread(on_db_thread, cache.sweep) == 0
        await cache.aclose()

    asyncio.run(scenario())


def test_a_claim_naming_a_deleted_provider_drops_it(tenant_a):
    kept, deleted = hooks(tenant_a, 2)

    async def scenario() -> None:
        cache = ProviderCache(size=10)
        cache.loop = asyncio.get_running_loop()
        await asyncio.to_thread(on_db_thread, cache.load, {kept.pk, deleted.pk})
        gone = cache.entries[deleted.pk].instance
        await asyncio.to_thread(on_db_thread, lambda: Provider.objects.filter(pk=deleted.pk).delete())
        await asyncio.to_thread(on_db_thread, cache.load, {kept.pk, deleted.pk})
        await settle()
        assert set(cache.entries) == {kept.pk} and closed(gone)
        await cache.aclose()

    asyncio.run(scenario())


def test_a_running_dispatcher_closes_a_provider_deleted_while_other_items_wait(tenant_a):
    """A whole dispatcher (its fetch loop, sweep and sends) in a thread: provider B sends, then is
    deleted while A's items wait (not due yet) and no claim names B again; the sweep closes B's
    instance and drops it, and A's items are delivered after."""
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60) as receiver:
        a, b = hook(tenant_a, "a", receiver.url), hook(tenant_a, "b", receiver.url)
        factories.queued(tenant_a, a, 2)
        factories.queued(tenant_a, b, 2)
        dispatcher = Dispatcher(DispatcherConfig(
            jitter=False, listen=False, event_lane=False, concurrency=10, batch_size=10, provider_sweep_seconds=0.1,
        ))  # fmt: skip
        runner = threading.Thread(target=lambda: asyncio.run(dispatcher.main()), daemon=True)
        runner.start()
        try:
            assert wait_until(lambda: Notification.objects.filter(status="delivered").count() == 4, 20)
            instance = dispatcher.providers.entries[b.pk].instance
            waiting = factories.queued(tenant_a, a, 2, delay=1.5)  # A's next items wait meanwhile
            Notification.objects.filter(provider=b).delete()
            Provider.objects.filter(pk=b.pk).delete()
            assert wait_until(lambda: b.pk not in dispatcher.providers.entries and closed(instance), 10)
            assert Notification.objects.filter(pk__in=[n.pk for n in waiting], status="queued").count() == 2
            assert wait_until(lambda: Notification.objects.filter(status="delivered").count() == 4, 20)
            assert a.pk in dispatcher.providers.entries
        finally:
            dispatcher.loop.call_soon_threadsafe(dispatcher._stop)
            runner.join(20)
    assert not runner.is_alive()
