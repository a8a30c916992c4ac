"""How the dispatcher starts, finishes and gives back sends, in-process against a real loopback
receiver: a provider with a callback path (`start_send`, the webhook provider) costs no task per
delivery; any other provider is awaited in a task; both are given back alike on shutdown."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from datetime import UTC, datetime

from core import crypto
from dispatch.claims import ClaimResult
from dispatch.delivery import DispatchLease, Prepared
from dispatch.dispatcher import Dispatcher, DispatcherConfig
from dispatch.providers import CachedProvider
from providers.kinds import build_provider
from providers.kinds.base import BaseProvider, DeliveryResult, OutboundMessage
from providers.transport import new_client
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

HOOK, SLOW = 1, 2


class SlowProvider(BaseProvider):
    """No callback path: awaited in a task. Delivers after `seconds`."""

    kind = "slow"

    def __init__(self, seconds: float) -> None:
        super().__init__({}, {})
        self.seconds = seconds

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        return {}

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        await asyncio.sleep(self.seconds)
        return DeliveryResult(delivered=True, http_status=200)


def items(count: int, provider_id: int) -> list[Prepared]:
    token = crypto.encrypt("https://customer.example/hook")
    tenant = str(uuid.uuid4())
    return [
        Prepared(
            DispatchLease(provider_id * 1000 + i, uuid.uuid4(), provider_id, False, str(uuid.uuid4()), tenant),
            "webhook", token, "s", "b", {"i": i}, datetime.now(UTC), 1, 1,
        )
        for i in range(count)
    ]  # fmt: skip


async def dispatcher_for(url: str, *, slow_seconds: float, grace: float) -> Dispatcher:
    """A dispatcher ready to send (what `Dispatcher.main` sets up), with a webhook provider and a
    provider that has no callback path."""
    dispatcher = Dispatcher(DispatcherConfig(concurrency=100, batch_size=50, jitter=False, grace_seconds=grace))
    dispatcher.bind(asyncio.get_running_loop())
    hook = build_provider("webhook", {"url": url}, {"signing_secret": TEST_SIGNING_SECRET})
    now = datetime.now(UTC)
    dispatcher.providers.entries[HOOK] = CachedProvider(hook, now, 5, False, time.monotonic())
    dispatcher.providers.entries[SLOW] = CachedProvider(SlowProvider(slow_seconds), now, 5, False, time.monotonic())
    return dispatcher


async def until_idle(dispatcher: Dispatcher, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while dispatcher.sender.inflight:
            dispatcher.sender.capacity.clear()
            await dispatcher.sender.capacity.wait()


def send_then_drain(url: str, *, each: int, slow_seconds: float, grace: float, before_drain=None):  # noqa: ANN001, ANN201
    """Start `each` webhook and `each` task-run sends, run `before_drain(dispatcher, work)` if given,
    drain as shutdown does; returns (dispatcher, work, seconds the drain took)."""

    async def run():
        dispatcher = await dispatcher_for(url, slow_seconds=slow_seconds, grace=grace)
        work = items(each, HOOK) + items(each, SLOW)
        for item in work:
            dispatcher.sender.start(item)
        if before_drain is not None:
            await before_drain(dispatcher, work)
        started = time.monotonic()
        await dispatcher._drain_inflight()
        took = time.monotonic() - started
        await asyncio.sleep(0.05)  # a late callback would land now
        await dispatcher.providers.entries[HOOK].instance.aclose()
        return dispatcher, work, took

    return asyncio.run(run())


def kinds(dispatcher: Dispatcher) -> dict[int, str]:
    return {o.lease.item_id: o.kind for o in dispatcher.recorder.pending}


def test_webhook_sends_run_without_a_task_and_other_providers_in_one():
    with HttpReceiver(secret=TEST_SIGNING_SECRET) as rx:

        async def run():
            dispatcher = await dispatcher_for(rx.url, slow_seconds=0.01, grace=1)
            for item in items(20, HOOK):  # the provider's connections opened (one task each)
                dispatcher.sender.start(item)
            await until_idle(dispatcher)
            dispatcher.recorder.pending.clear()
            hooks, slows = items(20, HOOK), items(3, SLOW)
            tasks_before = len(asyncio.all_tasks())
            for item in hooks + slows:
                dispatcher.sender.start(item)
            handles = {key: type(handle) for key, (handle, _) in dispatcher.sender.inflight.items()}
            tasks_added = len(asyncio.all_tasks()) - tasks_before
            await until_idle(dispatcher)
            await dispatcher.providers.entries[HOOK].instance.aclose()
            return dispatcher, hooks, slows, handles, tasks_added

        dispatcher, hooks, slows, handles, tasks_added = asyncio.run(run())
    assert all(not issubclass(handles[i.lease.item_id], asyncio.Task) for i in hooks)
    assert all(issubclass(handles[i.lease.item_id], asyncio.Task) for i in slows)
    assert tasks_added == len(slows)
    assert kinds(dispatcher) == {i.lease.item_id: "delivered" for i in hooks + slows}
    attempts = [o.attempt for o in dispatcher.recorder.pending]
    assert all(a.outcome == "delivered" and a.http_status == 200 and a.finished_at >= a.started_at for a in attempts)
    assert {i.notification_key for i in hooks} <= {r.webhook_id for r in rx.requests}
    assert all(r.verified for r in rx.requests)


def test_the_grace_period_gives_back_unfinished_sends_of_both_kinds():
    with HttpReceiver(secret=TEST_SIGNING_SECRET, delay_ms=3000) as rx:
        dispatcher, work, took = send_then_drain(rx.url, each=5, slow_seconds=3, grace=0.2)
    assert 0.15 < took < 1.5
    assert not dispatcher.sender.inflight
    assert kinds(dispatcher) == {i.lease.item_id: "deferred" for i in work}
    assert len(dispatcher.recorder.pending) == len(work)  # each given back once


def test_sends_that_finish_within_the_grace_period_are_recorded_as_delivered():
    with HttpReceiver(secret=TEST_SIGNING_SECRET, delay_ms=100) as rx:
        dispatcher, work, took = send_then_drain(rx.url, each=5, slow_seconds=0.1, grace=5)
    assert took < 2.0, "the drain ends when the last send does, not at the end of the grace period"
    assert kinds(dispatcher) == {i.lease.item_id: "delivered" for i in work}


def test_a_second_signal_gives_every_send_back_at_once():
    async def two_signals(dispatcher, work):  # noqa: ANN001, ANN202
        await asyncio.sleep(0.05)
        dispatcher._on_signal(signal.SIGTERM)
        assert len(dispatcher.sender.inflight) == len(work), "the first signal lets sends finish"
        dispatcher._on_signal(signal.SIGTERM)

    with HttpReceiver(secret=TEST_SIGNING_SECRET, delay_ms=3000) as rx:
        dispatcher, work, took = send_then_drain(rx.url, each=4, slow_seconds=3, grace=30, before_drain=two_signals)
    assert took < 1.0
    assert kinds(dispatcher) == {i.lease.item_id: "deferred" for i in work}
    assert len(dispatcher.recorder.pending) == len(work)


def test_a_failure_before_the_send_is_recorded_not_lost():
    async def run():
        dispatcher = await dispatcher_for("http://127.0.0.1:9/hook", slow_seconds=0, grace=1)
        (item,) = items(1, HOOK)
        item.recipient_token = "not a token"  # decrypting it fails inside _start_send
        dispatcher.sender.start(item)
        await dispatcher.providers.entries[HOOK].instance.aclose()
        return dispatcher, item

    dispatcher, item = asyncio.run(run())
    (outcome,) = dispatcher.recorder.pending
    assert outcome.lease is item.lease and outcome.attempt.error_code == "provider_crash"
    assert not dispatcher.sender.inflight


def test_sends_cancelled_before_their_task_first_ran_are_given_back_too():
    async def run():
        dispatcher = await dispatcher_for("http://127.0.0.1:9/hook", slow_seconds=3, grace=30)
        work = items(3, SLOW)
        for item in work:
            dispatcher.sender.start(item)
        dispatcher._on_signal(signal.SIGTERM)  # both signals before the tasks' first step
        dispatcher._on_signal(signal.SIGTERM)
        await dispatcher._drain_inflight()
        await dispatcher.providers.entries[HOOK].instance.aclose()
        return dispatcher, work

    dispatcher, work = asyncio.run(run())
    assert kinds(dispatcher) == {i.lease.item_id: "deferred" for i in work}
    assert len(dispatcher.recorder.pending) == len(work) and not dispatcher.sender.inflight


def test_giving_back_at_shutdown_opens_no_connection_for_the_sends_that_waited():
    """Cancelled newest first: the sends waiting for a connection go before those on the wire, so no
    freed slot is handed to a waiter that is about to be given back."""
    with HttpReceiver(secret=TEST_SIGNING_SECRET, delay_ms=3000) as rx:

        async def run():
            dispatcher = await dispatcher_for(rx.url, slow_seconds=0, grace=30)
            client = new_client(max_connections_per_host=4)
            secrets = {"signing_secret": TEST_SIGNING_SECRET}
            hook = build_provider("webhook", {"url": rx.url}, secrets, http_client=client)
            dispatcher.providers.entries[HOOK].instance = hook
            work = items(12, HOOK)
            for item in work:
                dispatcher.sender.start(item)
            await asyncio.sleep(0.2)  # four on the wire, eight waiting
            dispatcher._on_signal(signal.SIGTERM)
            dispatcher._on_signal(signal.SIGTERM)
            await dispatcher._drain_inflight()
            opening = len(client._opening)
            await asyncio.sleep(0.2)
            await client.aclose()
            return dispatcher, work, opening

        dispatcher, work, opening = asyncio.run(run())
    assert kinds(dispatcher) == {i.lease.item_id: "deferred" for i in work}
    assert opening == 0 and rx.stats()["connections"] == 4


def test_a_result_that_cannot_be_read_is_recorded_not_left_in_flight(monkeypatch):
    with HttpReceiver(secret=TEST_SIGNING_SECRET) as rx:

        async def run():
            dispatcher = await dispatcher_for(rx.url, slow_seconds=0, grace=1)
            hook = dispatcher.providers.entries[HOOK].instance

            def broken(response):  # noqa: ANN001, ANN202
                raise KeyError("a bug while reading the response")

            monkeypatch.setattr(hook, "_result", broken)
            work = items(3, HOOK)
            for item in work:
                dispatcher.sender.start(item)
            await until_idle(dispatcher)
            await hook.aclose()
            return dispatcher, work

        dispatcher, work = asyncio.run(run())
    assert len(dispatcher.recorder.pending) == len(work)
    assert {o.attempt.error_class for o in dispatcher.recorder.pending} == {"KeyError"}
    assert all(o.kind == "retry" for o in dispatcher.recorder.pending)  # unexplained: treated as transient


def test_a_claim_that_returns_after_a_signal_is_given_back_unsent():
    with HttpReceiver(secret=TEST_SIGNING_SECRET) as rx:

        async def run():
            dispatcher = await dispatcher_for(rx.url, slow_seconds=0, grace=1)
            work = items(5, HOOK)

            async def claim_during_which_a_signal_comes(fn, *args):  # noqa: ANN001, ANN202
                dispatcher._on_signal(signal.SIGTERM)
                return ClaimResult(send=work)

            dispatcher.db = claim_during_which_a_signal_comes
            await dispatcher._fetch_loop()
            await asyncio.sleep(0.1)
            await dispatcher.providers.entries[HOOK].instance.aclose()
            return dispatcher, work

        dispatcher, work = asyncio.run(run())
    assert kinds(dispatcher) == {i.lease.item_id: "deferred" for i in work}
    assert not dispatcher.sender.inflight and rx.requests == []
