"""A ring is claimed on the doorbell thread, on the LISTEN connection (dispatch.claims.Claimer.
claim_rung), whether the fetch loop sleeps or waits on the DB thread: each notification still goes
out exactly once, and the two claimers together stay within the concurrency; a ring the dispatcher
cannot take (no free slot, a claim under way, a LISTEN connection that carries LISTEN only) wakes the
fetch loop instead; items claimed there just before a stop are given back unsent.

The idle poll is made a minute long, so a delivery within seconds was rung."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from dispatch import dispatcher as dispatcher_module
from dispatch.dispatcher import Dispatcher, DispatcherConfig
from notifications.models import Notification
from queueing.models import QueueItem
from recipients import suppressions
from tests import factories
from tests.queueing.dispatch_support import wait_until
from tests.support.receivers import TEST_SIGNING_SECRET

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def long_idle_poll(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(dispatcher_module, "MIN_POLL", 60.0)
    monkeypatch.setattr(dispatcher_module, "MAX_POLL", 60.0)


def hook_for(tenant, receiver):  # noqa: ANN001, ANN201
    return factories.provider(tenant, config={"url": receiver.url}, secrets={"signing_secret": TEST_SIGNING_SECRET})


@contextmanager
def running(dispatcher: Dispatcher) -> Iterator[dict]:
    """The whole dispatcher in a thread, idle (its first claim found nothing) once this yields."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(code=dispatcher.run()), daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: getattr(dispatcher, "_idle", False), 20), "the fetch loop never went idle"
        time.sleep(0.3)  # LISTEN established (the doorbell starts before the first claim)
        yield result
    finally:
        dispatcher.loop.call_soon_threadsafe(dispatcher._on_signal, 15)
        thread.join(20)
    assert not thread.is_alive()


def test_rings_into_an_idle_dispatcher_are_claimed_on_the_listen_connection(tenant_a, webhook_receiver):
    hook = hook_for(tenant_a, webhook_receiver)
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=10, batch_size=10, event_lane=False))
    with running(dispatcher) as result:
        for n in range(1, 4):
            factories.queued(tenant_a, hook, 1)  # commits and rings
            assert wait_until(lambda n=n: len(webhook_receiver.requests) == n, 5)
            assert wait_until(lambda n=n: dispatcher._idle and dispatcher.processed == n, 5)
        assert dispatcher.rings_answered >= 3
    assert result["code"] == 0
    assert len(webhook_receiver.requests) == 3  # once each
    assert Notification.objects.filter(status="delivered").count() == 3
    assert not QueueItem.objects.exists()
    assert dispatcher._handed == dispatcher._taken == 3


def test_a_listen_connection_that_carries_listen_only_just_wakes_the_fetch_loop(
    tenant_a, webhook_receiver, settings
):  # fmt: skip
    """OMNIPOST_LISTEN_DATABASE_URL (a pooler's direct line for LISTEN): no claim is made on it."""
    params = connection.get_connection_params()
    settings.OMNIPOST_LISTEN_DATABASE_URL = (
        f"postgresql://{params['user']}:{params.get('password', '')}@{params.get('host') or '127.0.0.1'}:"
        f"{params.get('port') or 5432}/{params['dbname']}"
    )
    hook = hook_for(tenant_a, webhook_receiver)
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=10, batch_size=10, event_lane=False))
    with running(dispatcher):
        for n in range(1, 3):
            factories.queued(tenant_a, hook, 1)
            assert wait_until(lambda n=n: len(webhook_receiver.requests) == n, 5)
    assert dispatcher.rings_answered == 0
    assert Notification.objects.filter(status="delivered").count() == 2


def asked(calls: list):  # noqa: ANN201
    """A claim_rung double that asks for its slots as the real one does (under the lock) and claims nothing."""

    def claim_rung(conn, want):  # noqa: ANN001, ANN202
        calls.append(want())
        return None if calls[-1] <= 0 else ([], [], None)

    return claim_rung


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop for a dispatcher whose doorbell methods are called directly (not run)."""
    made = asyncio.new_event_loop()
    yield made
    made.close()


def test_a_ring_with_no_free_slot_is_left_to_the_fetch_loop(tenant_a, webhook_receiver, loop):
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=1, batch_size=10, event_lane=False))
    dispatcher.bind(loop)
    calls: list = []
    dispatcher.claimer.claim_rung = asked(calls)  # type: ignore[method-assign]
    dispatcher._idle = True
    dispatcher.sender.inflight[1] = (None, None)  # the one slot is taken
    assert dispatcher._answer_ring(object(), "default") is False
    assert calls == [0]
    del dispatcher.sender.inflight[1]
    assert dispatcher._answer_ring(object(), "default") is True  # the claim (a double) got nothing; idle
    assert calls == [0, 1], "a free slot: a claim for it"
    assert dispatcher._handed == 0, "the slot reserved for the claim is given back with what it did not get"
    dispatcher._idle = False
    assert dispatcher._answer_ring(object(), "default") is False, "nothing found: a working fetch loop is woken"


def test_the_two_claimers_never_take_the_same_slots(tenant_a, webhook_receiver, loop):
    """The fetch loop's claim holds its slots from the moment it is sized (under the claimer's lock)
    until its sends are in flight, and a doorbell claim's from its sizing until its hand-over: each
    sees the other's, so together they never go past the concurrency."""
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=10, batch_size=8, event_lane=False))
    dispatcher.bind(loop)
    calls: list = []
    dispatcher.claimer.claim_rung = asked(calls)  # type: ignore[method-assign]
    dispatcher._idle = True
    assert dispatcher._reserve(8, True) == 8  # the fetch loop's claim, under way or not yet handled
    assert dispatcher._answer_ring(object(), "default") is True and calls == [2], "2 slots left for a ring"
    dispatcher._reserved = 0
    dispatcher._handed = 7  # a ring's claim of 7, not yet taken over on the event loop
    assert dispatcher._reserve(8, True) == 3
    dispatcher._handed = 10
    assert dispatcher._reserve(8, True) == 0, "every slot held by the ring's claim: the fetch loop claims none"
    assert dispatcher._reserve(8, False) == 8, "a claim for the spare slots goes past the concurrency by design"


def test_a_ring_is_claimed_while_the_db_thread_is_busy(tenant_a, webhook_receiver):
    """The fetch loop is awake, waiting for the DB thread (here a 3 s call on it, as a record statement
    planned again after an ANALYZE): a ring's item is claimed on the doorbell thread meanwhile, not
    after it. Checked on the table (its lease) while the DB thread is still held."""
    hook = hook_for(tenant_a, webhook_receiver)
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=10, batch_size=10, event_lane=False))
    with running(dispatcher) as result:
        factories.queued(tenant_a, hook, 1)  # the provider read and cached once
        assert wait_until(lambda: dispatcher._idle and dispatcher.processed == 1, 5)
        answered = dispatcher.rings_answered
        held = asyncio.run_coroutine_threadsafe(dispatcher.db(time.sleep, 3.0), dispatcher.loop)
        dispatcher.loop.call_soon_threadsafe(dispatcher._rung)  # the fetch loop wakes, its claim queued behind
        assert wait_until(lambda: not dispatcher._idle, 2)
        started = time.monotonic()
        (note,) = factories.queued(tenant_a, hook, 1)  # commits and rings
        assert wait_until(lambda: QueueItem.objects.filter(notification_id=note.id, lock_token__isnull=False)
                          .exists(), 2), "the ring's item was not claimed while the DB thread was held"  # fmt: skip
        assert time.monotonic() - started < 2.5 and not held.done()
        assert dispatcher.rings_answered == answered + 1
        held.result(10)
        assert wait_until(lambda: dispatcher.processed == 2, 10)
    assert result["code"] == 0
    assert len(webhook_receiver.requests) == 2  # once each
    assert not QueueItem.objects.exists()
    assert dispatcher._handed == dispatcher._taken and dispatcher._reserved == 0


def test_a_backlog_claimed_by_both_threads_never_exceeds_the_concurrency(tenant_a, webhook_receiver):
    """200 items enqueued in 40 commits (40 rings) while a slow receiver keeps every slot busy: the
    fetch loop and the doorbell thread both claim, and the sends in flight (sampled every
    millisecond) never exceed the concurrency; each item is sent once."""
    webhook_receiver.behaviour.delay_ms = 30
    hook = hook_for(tenant_a, webhook_receiver)
    config = DispatcherConfig(jitter=False, concurrency=8, batch_size=8, event_lane=False, spare_slots=0)
    dispatcher = Dispatcher(config)
    most = [0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            held = len(dispatcher.sender.inflight)
            most[0] = max(most[0], held)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    with running(dispatcher) as result:
        sampler.start()
        try:
            for _ in range(40):
                factories.queued(tenant_a, hook, 5)
            assert wait_until(lambda: dispatcher.processed == 200, 60)
        finally:
            sampling.set()
            sampler.join(5)
    assert result["code"] == 0
    assert 0 < most[0] <= 8
    assert dispatcher.rings_answered > 0
    assert dispatcher._handed == dispatcher._taken and dispatcher._reserved == 0
    assert len(webhook_receiver.requests) == 200
    assert len({r.payload["id"] for r in webhook_receiver.requests}) == 200
    assert not QueueItem.objects.exists()


def test_a_claim_under_way_on_the_db_thread_makes_the_ring_wake_the_fetch_loop(tenant_a, webhook_receiver):
    hook = hook_for(tenant_a, webhook_receiver)
    factories.queued(tenant_a, hook, 1)
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=10, batch_size=10, event_lane=False))
    dispatcher._idle = True
    with dispatcher.claimer.lock:  # the DB thread's claim
        assert dispatcher.claimer.claim_rung(connection.connection, 10) is None
    assert QueueItem.objects.get().lock_token is None  # nothing was claimed


def test_items_claimed_on_the_doorbell_thread_as_a_stop_comes_are_given_back_unsent(tenant_a, webhook_receiver):
    hook = hook_for(tenant_a, webhook_receiver)
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=10, batch_size=10, event_lane=False))
    claim_rung = dispatcher.claimer.claim_rung

    def claim_then_a_signal(conn, want):  # noqa: ANN001, ANN202
        claimed = claim_rung(conn, want)
        if claimed and claimed[0]:
            dispatcher.loop.call_soon_threadsafe(dispatcher._on_signal, 15)
            time.sleep(0.2)  # the signal is handled before the hand-over is
        return claimed

    dispatcher.claimer.claim_rung = claim_then_a_signal  # type: ignore[method-assign]
    with running(dispatcher) as result:
        (note,) = factories.queued(tenant_a, hook, 1)
        assert wait_until(lambda: dispatcher.stopping.is_set(), 5)
    assert result["code"] == 0
    assert webhook_receiver.requests == []
    item = QueueItem.objects.get(notification_id=note.id)
    assert item.lock_token is None and item.attempts == 0  # given back untried: the attempt refunded
    note.refresh_from_db()
    assert note.status == "queued"
    assert dispatcher.rings_answered == 1


def test_slots_a_ring_claimed_and_did_not_send_wake_a_fetch_loop_waiting_for_one(tenant_a, webhook_receiver):
    """The fetch loop's claim, queued behind the DB thread, finds every slot taken by a ring's claim
    and waits for one; the ring's items are then suppressed (sorted on the DB thread): no send starts
    or finishes, yet their slots are free again, and the loop must look (it goes round and sleeps)
    rather than wait for a ring that may never come."""
    hook = hook_for(tenant_a, webhook_receiver)
    config = DispatcherConfig(jitter=False, concurrency=2, batch_size=2, event_lane=False, spare_slots=0)
    dispatcher = Dispatcher(config)
    blocked = "https://example.test/blocked"
    suppressions.suppress(tenant_a.pk, "webhook", blocked, "manual")
    with running(dispatcher) as result:
        answered = dispatcher.rings_answered
        held = asyncio.run_coroutine_threadsafe(dispatcher.db(time.sleep, 1.0), dispatcher.loop)
        dispatcher.loop.call_soon_threadsafe(dispatcher._rung)  # the fetch loop wakes, its claim queued behind
        assert wait_until(lambda: not dispatcher._idle, 2)
        factories.queued(tenant_a, hook, 2, recipient=blocked)  # one ring: its claim takes both slots
        assert wait_until(lambda: dispatcher.rings_answered == answered + 1, 2) and not held.done()
        held.result(10)
        assert wait_until(lambda: Notification.objects.filter(status="suppressed").count() == 2, 5)
        assert wait_until(lambda: dispatcher._idle, 5), "the fetch loop still waits for a slot"
    assert result["code"] == 0
    assert webhook_receiver.requests == []
    assert dispatcher._handed == dispatcher._taken == 2 and dispatcher._reserved == 0
