"""The event lane's records on the dispatcher's database thread: at each result's pace while the
dispatcher keeps up, about once a BUSY_INTERVAL while it has a backlog (dispatch.events)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from dispatch import events as lane_module
from dispatch.events import EventLane
from events.deliveries import DELIVERED, Result

pytestmark = pytest.mark.timeout(30)


def record_calls(busy: bool, results: int, every: float) -> list[int]:
    """Sizes of the record statements the lane ran for `results` results arriving `every` seconds."""
    calls: list[int] = []

    async def db(fn, batch):  # noqa: ANN001, ANN202 - the dispatcher's DB thread, stood in for
        assert fn is lane_module._record
        calls.append(len(batch))
        return {r.delivery_id for r in batch}

    async def scenario() -> None:
        lane = EventLane(db, batch_size=100, busy=lambda: busy)
        recorder = asyncio.create_task(lane._record_loop())
        for i in range(results):
            lane.results.append(Result(i, uuid.uuid4(), DELIVERED))
            lane.record_wake.set()
            await asyncio.sleep(every)
        lane.stopping.set()
        lane.record_wake.set()
        await asyncio.wait_for(recorder, 5)
        await lane.client.aclose()

    asyncio.run(scenario())
    return calls


def test_an_idle_dispatcher_records_event_results_as_they_come():
    calls = record_calls(busy=False, results=20, every=0.02)
    assert sum(calls) == 20
    assert len(calls) >= 8, calls  # one statement per result or two: nothing waits for company


def test_a_busy_dispatcher_records_event_results_about_once_an_interval_and_loses_none():
    calls = record_calls(busy=True, results=40, every=0.005)  # 40 results over ≥ 0.2 s
    assert sum(calls) == 40
    assert len(calls) <= 1 + 40 * 0.005 / lane_module.BUSY_INTERVAL + 2, calls
    assert max(calls) >= 10, calls


def test_a_busy_dispatcher_records_a_full_batch_at_once():
    calls = record_calls(busy=True, results=250, every=0)
    assert sum(calls) == 250
    assert max(calls) <= 250 and len(calls) <= 4, calls


def test_the_lane_holds_back_only_behind_a_backlog_of_notifications():
    """Dispatcher._busy, what the lane asks: a claim that got all it asked for, or every slot taken —
    not merely a notification in flight (a dispatcher that keeps up leaves the lane at full speed)."""
    import time

    from dispatch.dispatcher import Dispatcher, DispatcherConfig

    dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=3, batch_size=10))
    assert not dispatcher._busy()
    dispatcher.sender.inflight.update({1: object(), 2: object()})  # in flight, a slot free, no full claim
    assert not dispatcher._busy()
    dispatcher.sender.inflight[3] = object()  # every slot taken
    assert dispatcher._busy()
    dispatcher.sender.inflight.clear()
    dispatcher._full_claim_at = time.monotonic()  # a claim just got all it asked for
    assert dispatcher._busy()
    dispatcher._full_claim_at = time.monotonic() - 0.3
    assert not dispatcher._busy()
