"""A ring that finds the dispatcher idle is claimed on the doorbell thread, on the LISTEN connection
(dispatch.claims.Claimer.claim_rung): each notification still goes out exactly once; a ring the
dispatcher cannot take (no free slot, a claim under way, a LISTEN connection that carries LISTEN
only) wakes the fetch loop instead; items claimed there just before a stop are given back unsent.

The idle poll is made a minute long, so a delivery within seconds was rung."""

from __future__ import annotations

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


def test_a_ring_with_no_free_slot_is_left_to_the_fetch_loop(tenant_a, webhook_receiver):
    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=1, batch_size=10, event_lane=False))
    calls: list = []
    dispatcher.claimer.claim_rung = lambda conn, want: calls.append(want)  # type: ignore[method-assign]
    dispatcher._idle = True
    dispatcher.sender.inflight[1] = (None, None)  # the one slot is taken
    assert dispatcher._answer_ring(object(), "default") is False
    assert calls == []
    del dispatcher.sender.inflight[1]
    assert dispatcher._answer_ring(object(), "default") is False  # the claim (a double) got nothing
    assert calls == [1], "a free slot: a claim for it"
    assert dispatcher._handed == 0, "the slot reserved for the claim is given back with what it did not get"


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
