"""The dispatcher: claims batches, delivers them concurrently on asyncio, records every outcome.

One process keeps up to `concurrency` provider calls in flight on one event loop. All database
work runs on one dedicated thread (one connection), in short transactions with a fixed number of
statements per batch: [stage] [take tokens] → claim + read providers' versions → … sends … →
record outcomes. A second connection LISTENs for enqueues (queueing.wakeup): a ring is
claimed at once on that connection, on the doorbell thread, unless a claim is under way
(dispatch.claims: its server process is awake, and no thread has to wake before the claim, nor
wait for the DB thread's statements); any other ring wakes the fetch loop, which claims; without
rings it polls with backoff.

The class orchestrates; its collaborators do the work: `Claimer` (dispatch.claims), `Sender`
(dispatch.sending, which asks dispatch.policy what to do with each result), `Recorder`
(dispatch.recording), `ProviderCache` (dispatch.providers) and the loops of dispatch.upkeep.

Shutdown (SIGTERM/SIGINT): stop claiming, let in-flight sends finish within the grace period,
give back whatever has not been sent, record everything, exit 0. A second signal ends the grace
period at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import random
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings
from django.db import connection

from core import tracing
from core.db_faults import Backoff, is_connection_lost, reset_connection
from dispatch import gc_tuning, upkeep
from dispatch.claims import Claimer, ClaimResult, can_claim_on_listen_connection
from dispatch.delivery import ClaimSeen, DispatchLease, Outcome, Prepared, Recorded
from dispatch.events import EventLane
from dispatch.providers import SWEEP_SECONDS, ProviderCache
from dispatch.recording import Recorder, SessionLost
from dispatch.sending import Sender
from dlq.retry import RetryPolicy
from queueing import heartbeat, janitor
from queueing.models import Worker
from queueing.wakeup import Doorbell
from routing.failover import Router

logger = logging.getLogger("omnipost.dispatcher")

MIN_POLL = 0.05
# With work coming, the janitor's VACUUM on the DB thread holds up every claim behind it (a fifth of that
# thread's time during a broadcast, measured): it waits for five times the dead rows, which the
# scheduler's janitor, between its batches, clears first where one runs, and leaves ANALYZE to it.
BUSY_VACUUM_FACTOR = 5.0
WORKING_SECONDS = 2.0
MAX_POLL = 1.0

__all__ = ["Dispatcher", "DispatcherConfig", "Observer", "SessionLost"]


@dataclass
class DispatcherConfig:
    queues: list[str] | None = None
    concurrency: int = 100
    batch_size: int = 100
    grace_seconds: float = 10.0
    once: bool = False
    max_items: int | None = None
    lease_seconds: float = field(default_factory=lambda: float(settings.OMNIPOST_LEASE_SECONDS))
    jitter: bool = True
    listen: bool = True  # LISTEN for enqueues; off, idle workers only poll
    event_lane: bool = True  # run the event lane (tenants' event webhooks, dispatch.events) beside notifications
    event_concurrency: int = 100
    event_batch_size: int = 100
    # Sends beyond `concurrency` that only tenants with fewer than this many in flight may take (see
    # `_fetch_loop`); None: a tenth of `concurrency`, at least 1. 0: none.
    spare_slots: int | None = None
    # how often cached providers are checked for deleted rows (dispatch.providers)
    provider_sweep_seconds: float = SWEEP_SECONDS

    @property
    def spare(self) -> int:
        return max(1, self.concurrency // 10) if self.spare_slots is None else max(0, self.spare_slots)


class Observer(Protocol):
    """Told when the dispatcher is ready to claim (after start-up) and when it has stopped; the
    benchmarks gate starts and read figures through one (benchmarks.dispatcher)."""

    def started(self, dispatcher: Dispatcher) -> Any: ...  # noqa: ANN401 - may be awaitable
    def stopped(self, dispatcher: Dispatcher) -> None: ...


class Dispatcher:
    def __init__(
        self, config: DispatcherConfig, *, clock: Callable[[], float] = time.monotonic, observer: Observer | None = None
    ) -> None:
        self.config = config
        self.observer = observer
        self.stopping = asyncio.Event()
        self.wake = asyncio.Event()
        self.force = self.failed = False
        self.claimed = 0
        self.claimed_by_tenant: Counter[str] = Counter()
        self.worker: Worker | None = None
        self.providers = ProviderCache(clock)
        self.recorder = Recorder(self.db, self.providers, on_bug=self._recording_broke)
        self.router = Router(clock)
        self.recorder.on_breakers = self.router.learn  # a breaker opened by a record is routed around at once
        self.sender = Sender(self.providers, self.recorder, RetryPolicy.from_settings(), self.router)
        self.claimer = Claimer(config.queues, config.lease_seconds, self.providers, clock, self.router)
        self._outage = Backoff(first=MIN_POLL, cap=MAX_POLL * 5)  # the fetch loop's, while the database is away
        self.event_lane: EventLane | None = None
        if config.event_lane:
            self.event_lane = EventLane(
                self.db, batch_size=config.event_batch_size, concurrency=config.event_concurrency,
                lease_seconds=config.lease_seconds, busy=self._busy,
            )  # fmt: skip
            self.recorder.after_write = self._nudge_event_lane
        self._full_claim_at = 0.0  # time.monotonic() of the last claim that found as many as it asked for
        self._found_at = float("-inf")  # time.monotonic() of the last claim that found anything
        self.event_lane_stop = asyncio.Event()  # the lane's own: in --once it outlives the fetch loop
        self.notifications_recorded = asyncio.Event()
        # Slots taken by claims whose items are not in flight yet, so that neither claimer overfills
        # `concurrency`: rings answered on the doorbell thread (`_answer_ring`) hold `_handed - _taken`
        # (written there and on the event loop, one writer each), the fetch loop's claim `_reserved`
        # (set under the claimer's lock on the DB thread, cleared on the event loop once handled).
        self._idle = False  # the fetch loop sleeps, its last claim having found nothing
        self._handed = self._taken = self._reserved = 0
        self.rings_answered = 0  # claims made on the doorbell thread (tests, benchmarks)
        self._takeovers: set[asyncio.Task] = set()

    @property
    def processed(self) -> int:
        return self.recorder.processed

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = self.providers.loop = loop

    # --- entry points -----------------------------------------------------------------------------
    def run(self) -> int:
        try:
            import uvloop  # a faster event loop where it is installed (Linux, macOS)
        except ImportError:
            return asyncio.run(self.main())
        return uvloop.run(self.main())

    async def main(self) -> int:
        self.bind(asyncio.get_running_loop())
        self.db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omnipost-db")
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                self.loop.add_signal_handler(sig, self._on_signal, sig)
        if self.config.jitter:
            await asyncio.sleep(random.random() * 0.5)  # noqa: S311 - start-up jitter, not crypto
        self.worker = await self._until_connected(heartbeat.register, "dispatcher", self.config.queues or ["*"])
        gc_tuning.settle_after_start_up(self.config.concurrency, self.config.batch_size)
        answers = self.config.max_items is None and not self.config.once and can_claim_on_listen_connection()
        bell = Doorbell(
            self._ring, application_name=f"omnipost-dispatcher-listen-{socket.gethostname()}-{os.getpid()}",
            answer=self._answer_ring if answers else None,
        )  # fmt: skip
        if self.observer is not None and asyncio.iscoroutine(started := self.observer.started(self)):
            await started
        if self.config.listen:
            bell.start()
        logger.info(
            "dispatcher %s:%s started (concurrency %d, batch %d, queues %s)", socket.gethostname(), os.getpid(),
            self.config.concurrency, self.config.batch_size, ",".join(self.config.queues or ["*"]),
        )  # fmt: skip
        recorder = asyncio.create_task(self.recorder.run(), name="recorder")
        lane = None
        if self.event_lane is not None:
            lane = asyncio.create_task(
                self.event_lane.run(self.event_lane_stop, self.config.grace_seconds,
                                once_after=self.notifications_recorded if self.config.once else None),
                name="event-lane",
            )  # fmt: skip
        loops = [
            asyncio.create_task(upkeep.keep_leases(self.db, self.sender.inflight, self.config.lease_seconds)),
            asyncio.create_task(upkeep.beat(self.db, self.worker, lambda: self.processed)),
            asyncio.create_task(
                upkeep.sweep_providers(self.db, self.providers.sweep, self.config.provider_sweep_seconds)
            ),
            asyncio.create_task(upkeep.maintain(self.db, keeper=janitor.Janitor(
                every=0.0, busy=self._busy, working=self._working, busy_factor=BUSY_VACUUM_FACTOR))),
        ]
        try:
            await self._fetch_loop()
        finally:
            self.stopping.set()
            await self.loop.run_in_executor(None, bell.stop)
            await asyncio.sleep(0)  # hand-overs the doorbell thread scheduled run (and give back)
            if self._takeovers:
                await asyncio.gather(*self._takeovers, return_exceptions=True)
            await self._drain_inflight()
            self.recorder.finished.set()
            self.recorder.wake.set()
            await recorder
            self.notifications_recorded.set()
            if lane is not None:
                if not self.config.once:
                    self.event_lane_stop.set()
                await lane
            for task in loops:
                task.cancel()
            try:
                await self.db(heartbeat.stop, self.worker)
            except Exception as exc:  # noqa: BLE001 - the registry shows the worker stale instead
                logger.warning("could not record the dispatcher's stop (%s)", exc)
            await self.providers.aclose()
            await self.db(lambda: connection.close())  # resolved on the DB thread
            self.db_thread.shutdown(wait=True)
            if self.observer is not None:
                self.observer.stopped(self)
        if self.failed:
            return 1
        logger.info("dispatcher stopped after %d deliveries; claims by tenant: %s", self.processed,
                    json.dumps(dict(self.claimed_by_tenant)))  # fmt: skip
        return 0

    async def _until_connected(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn` on the DB thread, retried with backoff while the database is unreachable (a
        dispatcher started during an outage waits for it instead of exiting)."""
        backoff = Backoff(first=0.1, cap=5.0)
        while True:
            try:
                return await self.db(fn, *args)
            except SessionLost as exc:
                if self.stopping.is_set():
                    raise
                delay = backoff.next()
                logger.warning("database unavailable at start-up (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)

    def _on_signal(self, sig: int) -> None:
        if self.stopping.is_set():
            logger.warning("second %s: giving back in-flight work now", signal.Signals(sig).name)
            self.force = self.recorder.force = True
            self.sender.cancel_all()
        else:
            logger.info("%s received: no new claims; finishing in-flight work (grace %.0fs)",
                        signal.Signals(sig).name, self.config.grace_seconds)  # fmt: skip
        self._stop()

    def _stop(self) -> None:
        self.stopping.set()
        self.event_lane_stop.set()
        self.wake.set()
        self.sender.capacity.set()

    def _busy(self) -> bool:
        """A backlog of notifications: every slot taken, or a claim within the last 0.2 s got all it
        asked for. The event lane then holds back; under a load the dispatcher keeps up with (claims
        that find fewer than they ask for) it sends as events come."""
        return (len(self.sender.inflight) >= self.config.concurrency
                or time.monotonic() - self._full_claim_at < 0.2)  # fmt: skip

    def _working(self) -> bool:
        """Claims found work within the last WORKING_SECONDS: a backlog, or sends kept up with as they
        come (a broadcast's, made by the scheduler at its pace). The janitor holds back then."""
        return time.monotonic() - self._found_at < WORKING_SECONDS

    def _nudge_event_lane(self, recorded: Recorded) -> None:
        if recorded.batched:  # the record statement filled the outbox: open it into events and send them soon
            self.event_lane.nudge()  # type: ignore[union-attr]

    def _recording_broke(self) -> None:
        self.failed = True
        self._stop()

    def _wants(self, payload: str) -> bool:
        return not self.config.queues or not payload or bool(set(payload.split(",")) & set(self.config.queues))

    def _ring(self, payload: str) -> None:
        """On the doorbell thread: wake the fetch loop (which then reads the table), nothing more."""
        if self._wants(payload):
            self.loop.call_soon_threadsafe(self._rung)

    def _free(self) -> int:
        """Slots left, counting the items claimed (on either thread) that are not in flight yet. The
        claims' counts are read before the sends in flight: their writers start the sends first and
        lower the counts after, so an item is in one or the other whichever thread reads."""
        pending = self._reserved + self._handed - self._taken
        return self.config.concurrency - pending - len(self.sender.inflight)

    def _reserve(self, want: int, cap: bool) -> int:
        """The fetch loop's claim size, asked under the claimer's lock: `want`, capped (`cap`) to the
        slots a claim on the doorbell thread left, and held as `_reserved` until the claim is handled.
        (Uncapped: a claim for the spare slots, over the concurrency by design.)"""
        self._reserved = max(0, min(want, self._free()) if cap else want)
        return self._reserved

    def _answer_ring(self, conn: Any, payload: str) -> bool:  # noqa: ANN401 - the LISTEN psycopg connection
        """On the doorbell thread: claim for a ring on the LISTEN connection (dispatch.claims.Claimer.
        claim_rung) and hand what it got to the event loop, whether the fetch loop sleeps or waits on
        the DB thread (behind a record statement, say: the ring's items need not wait there). False
        (the fetch loop is woken instead) when stopping, with no free slot, when the claim could not
        be made, or when it found nothing while the fetch loop works (lanes are the fetch loop's)."""
        if self.stopping.is_set() or not self._wants(payload):
            return False
        idle = self._idle
        asked = 0

        def slots() -> int:  # under the claimer's lock: a claim on the DB thread sees these slots taken
            nonlocal asked
            asked = max(0, min(self.config.batch_size, self._free()))
            self._handed += asked
            return asked

        claimed = None
        try:
            claimed = self.claimer.claim_rung(conn, slots)
        except Exception as exc:  # noqa: BLE001 - the fetch loop claims instead (and gives back a lost claim)
            logger.warning("claim on the LISTEN connection failed (%s); waking the fetch loop", type(exc).__name__)
        finally:
            unused = asked - (len(claimed[0]) if claimed else 0)
            self._handed -= unused
            if unused:  # a fetch loop waiting for a slot looks again
                self.loop.call_soon_threadsafe(self.sender.capacity.set)
        if claimed is None:
            return False
        prepared, skipped, seen = claimed
        self.rings_answered += 1
        if prepared or skipped:
            full = len(prepared) + len(skipped) >= asked
            self.loop.call_soon_threadsafe(self._take_over, prepared, skipped, seen, full)
            return True
        return idle  # nothing found: a peer was faster; a working fetch loop looks at its lanes too

    def _take_over(self, prepared: list[Prepared], skipped: list[DispatchLease], seen: ClaimSeen, full: bool) -> None:
        """On the event loop: start what the doorbell thread claimed, sorted from memory when that
        needs no statement, else on the DB thread first (`_start_handed`)."""
        result = self.claimer.sort_in_memory(prepared, seen)
        if result is None:
            task = self.loop.create_task(self._sort_then_take_over(prepared, skipped, seen, full))
            self._takeovers.add(task)
            task.add_done_callback(self._takeovers.discard)
            return
        self._start_handed(result, len(prepared), skipped, full)

    async def _sort_then_take_over(
        self, prepared: list[Prepared], skipped: list[DispatchLease], seen: ClaimSeen, full: bool
    ) -> None:
        try:
            result = await self.db(self.claimer.sort, prepared, seen)
        except SessionLost:
            result = ClaimResult(unready=prepared)
        except Exception:  # noqa: BLE001 - never lost: given back untried
            logger.exception("sorting %d items claimed on the LISTEN connection failed", len(prepared))
            result = ClaimResult(unready=prepared)
        self._start_handed(result, len(prepared), skipped, full)

    def _start_handed(self, result: ClaimResult, handed: int, skipped: list[DispatchLease], full: bool) -> None:
        """A doorbell claim's `handed` items, sorted into `result`, to their places; their slots then
        count as in flight (or free) instead of held. A full claim marks the dispatcher busy and wakes
        the fetch loop for more."""
        result.skipped = skipped
        try:
            self._handle(result)
        finally:
            self._taken += handed  # after: the doorbell thread never sees them neither held nor in flight
            self.sender.capacity.set()  # what was not started left its slots free: a waiting fetch loop looks
        if full:
            self._full_claim_at = time.monotonic()
            self.wake.set()

    def _rung(self) -> None:
        self.wake.set()
        self.sender.capacity.set()  # a fetch loop waiting for a slot looks at its spare ones

    def _noisy(self) -> frozenset[str]:
        """Tenants holding `spare` or more of this dispatcher's sends in flight."""
        held = Counter(item.tenant_key for _, item in self.sender.inflight.values())
        return frozenset(tenant for tenant, n in held.items() if n >= self.config.spare)

    async def db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on the database thread. A lost session (any driver's error for it: psycopg's
        own from the hot path's raw cursor, or Django's) drops the connection and raises
        `SessionLost`; the caller backs off and tries again, on a new connection."""

        def call() -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if is_connection_lost(exc):
                    reset_connection()
                    raise SessionLost(f"{type(exc).__name__}: {str(exc).strip()[:200]}") from exc
                raise

        return await self.loop.run_in_executor(self.db_thread, call)

    # --- claiming -----------------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        """Claims while slots are free. Once all `concurrency` are taken, a ring (an enqueue) may still
        claim up to `spare` more, for tenants other than those holding `spare` or more in flight: with
        every slot held by one tenant's deep backlog, another tenant's notification is sent as soon as
        it is enqueued instead of waiting for a slot and for its turn in the claim that fills it."""
        poll = MIN_POLL
        capacity = self.sender.capacity
        while not self.stopping.is_set():
            free = self._free()
            remaining = None if self.config.max_items is None else max(0, self.config.max_items - self.claimed)
            if remaining == 0:
                return
            leave_out: frozenset[str] = frozenset()
            if free <= 0:
                spare = self.config.spare + free
                if spare <= 0 or not self.wake.is_set() or self.config.queues:
                    capacity.clear()
                    await capacity.wait()
                    continue
                free, leave_out = spare, self._noisy()
            want = min(self.config.batch_size, free, remaining if remaining is not None else free)
            self.wake.clear()  # a ring from here on finds work this claim may miss: claim again
            claim_started = tracing.now() if tracing.ENABLED else 0
            try:
                # a long-running dispatcher stages below, after the sends; a single pass (--once) first
                # without leave_out, capped once the claim lock is held: by then a claim on the doorbell
                # thread may have taken slots (a spare-slot claim is over the concurrency by design)
                wanted = functools.partial(self._reserve, want, not leave_out)
                claimed = await self.db(self.claimer.claim, wanted, leave_out, self.config.once)
            except SessionLost as exc:
                self._reserved = 0
                delay = self._outage.next()
                logger.warning("database unavailable while claiming (%s); retrying in %.2fs", exc, delay)
                await self._sleep(delay)
                continue
            self._outage.reset()
            if claim_started:  # traces are exported: the claim's window, for the claim spans of its sends
                self.sender.claim_window = (claim_started, tracing.now())
            reserved = self._reserved
            self._handle(claimed)
            self._reserved = 0  # after: its sends are in flight
            if reserved == 0:  # claims on the doorbell thread took the slots first: wait for one
                continue
            # Due retries come back into the ready set after the claim's sends have started: a ring's
            # claim never waits behind the stager (every STAGE_SECONDS). What it brings back is claimed next.
            if not self.config.once and not self.stopping.is_set() and self.claimer.stage_is_due():
                try:
                    if await self.db(self.claimer.stage_due):
                        self.wake.set()
                except SessionLost:
                    pass  # the next claim meets the outage and backs off
            finished = len(claimed.skipped) + len(claimed.suppressed)
            returned = len(claimed.waiting) + len(claimed.relaned)
            if claimed.send or finished or returned:
                if len(claimed.send) + finished + returned >= want:
                    self._full_claim_at = time.monotonic()
                poll = MIN_POLL
                continue
            if self.config.once:
                return
            next_token_in = claimed.next_token_in
            self._idle = True  # a ring from here on that finds nothing leaves the loop asleep
            try:
                await self._sleep(poll if next_token_in is None else min(poll, max(0.005, next_token_in)))
            finally:
                self._idle = False
            poll = min(poll * 2, MAX_POLL)

    def _handle(self, claimed: ClaimResult) -> None:
        """What a claim got, each item to its place: sends started, the rest recorded or given back."""
        if claimed.unready:  # claimed, but the session was lost before their providers were loaded
            self._give_back(claimed.unready)
        if claimed.skipped:
            self.recorder.extend(Outcome(lease=lease, kind="skipped") for lease in claimed.skipped)
        if claimed.suppressed:
            self.recorder.extend(Outcome(lease=lease, kind="suppressed") for lease in claimed.suppressed)
        if claimed.waiting:  # every provider of their failover order is open: back with the backoff, untried
            self.recorder.extend(self.sender.waiting(p) for p in claimed.waiting)
        if claimed.relaned:  # failed over to a rate-limited provider: into its lane, untried
            self.recorder.extend(self.sender.to_lane(p) for p in claimed.relaned)
        self._start_all(claimed.send)
        found = len(claimed.send) + len(claimed.skipped) + len(claimed.suppressed)
        if found:
            self._found_at = time.monotonic()
        self.claimed += found
        self.claimed_by_tenant.update(p.tenant_key for p in claimed.send)

    def _start_all(self, prepared: list[Prepared]) -> None:
        """Start a claim's sends, or give them all back if a signal came while it was being claimed."""
        if self.stopping.is_set():
            self._give_back(prepared)
            return
        for item in prepared:
            self.sender.start(item)

    def _give_back(self, prepared: list[Prepared]) -> None:
        self.recorder.extend(Outcome(lease=p.lease, kind="deferred") for p in prepared)

    async def _sleep(self, seconds: float) -> None:
        """Until `seconds` pass or a ring (or a signal) comes; a ring during the claim counts."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=seconds)
        self.wake.clear()

    async def _drain_inflight(self) -> None:
        await self.sender.drain(self.config.grace_seconds, lambda: self.force)
