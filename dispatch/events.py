"""The event lane: delivers tenants' event webhooks from the dispatcher process, beside notifications.

Events never delay notifications: the lane has its own claim (`events.deliveries.claim_due`, one
statement per batch, `FOR UPDATE SKIP LOCKED`, a lease on the database's clock), its own
in-flight limit and its own recording (one statement per batch). Its SQL runs on the
dispatcher's database thread (a process keeps to two connections), between the notification
work; an idle lane polls with backoff (50 ms to 1 s) and is nudged when the dispatcher records
outcomes that may have made events.

Each endpoint gets a `WebhookProvider` (providers.kinds.webhook): the same Standard
Webhooks signing (with the previous secret beside the new one during a rotation's grace), result
classification and SSRF-guarded HTTP client as webhook providers; `webhook-id` is the event id,
the same on every retry. Retries follow the notifications' backoff (dispatch.policy.decide_event).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from core import crypto
from core.db_faults import Backoff
from dispatch import policy
from dispatch.delivery import hot_cursor
from dispatch.recording import SessionLost
from dlq.retry import RetryPolicy
from events import deliveries
from events.deliveries import Claimed, Result
from providers.kinds.base import DeliveryResult
from providers.kinds.webhook import WebhookProvider
from providers.transport import new_client

logger = logging.getLogger("omnipost.dispatcher.events")

MIN_POLL = 0.05
MAX_POLL = 1.0
# While the dispatcher has a backlog of notifications (dispatch.dispatcher.Dispatcher._busy: its
# slots full, or its claims getting all they ask for), the lane claims at most one batch this often
# (≤ batch_size / BUSY_INTERVAL events a second) and records its results about this often (or a
# batch at a time): notifications come first, the backlog of events goes out at full speed once
# the dispatcher keeps up. Measured (bench/events_bench.py, docs/PERFORMANCE.md): at 0.1 s the
# lane's sends took a fifth of a saturated dispatcher's rate.
BUSY_INTERVAL = 1.0
GATHER_SECONDS = 0.005
TIMEOUT_SECONDS = 10.0

Db = Callable[..., Awaitable[Any]]


class EventLane:
    def __init__(
        self, db: Db, *, batch_size: int = 100, concurrency: int = 50, lease_seconds: float = 30.0,
        retry: RetryPolicy | None = None, busy: Callable[[], bool] = lambda: False,
    ) -> None:  # fmt: skip
        """`busy`: does the dispatcher have notifications in hand now (the lane then holds back)."""
        self.db = db
        self.busy = busy
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.retry = retry or RetryPolicy.from_settings()
        self.client = new_client()
        self.signers: dict[int, tuple[datetime, WebhookProvider]] = {}  # endpoint id -> (its version, its sender)
        self.inflight: dict[int, tuple[Any, Claimed]] = {}  # delivery id -> (handle, claimed)
        self.results: list[Result] = []
        self.stopping = asyncio.Event()
        self.wake = asyncio.Event()
        self.capacity = asyncio.Event()
        self.record_wake = asyncio.Event()
        self.delivered = self.attempted = 0

    def nudge(self) -> None:
        """Events may have been made (the dispatcher recorded outcomes): look soon."""
        self.wake.set()

    # --- loops ----------------------------------------------------------------------------------
    async def run(self, stopping: asyncio.Event, grace_seconds: float, once_after: asyncio.Event | None = None) -> None:
        """Claim and deliver until `stopping`; with `once_after` (the dispatcher's --once), until
        that is set and nothing is due or in flight any more."""
        recorder = asyncio.create_task(self._record_loop(), name="event-recorder")
        try:
            await self._claim_loop(stopping, once_after)
        finally:
            await self._drain(grace_seconds)
            self.stopping.set()
            self.record_wake.set()
            await recorder
            await self.client.aclose()

    async def _claim_loop(self, stopping: asyncio.Event, once_after: asyncio.Event | None) -> None:
        poll = MIN_POLL
        outage = Backoff(first=MIN_POLL, cap=MAX_POLL * 5)
        last_claim = 0.0
        while not stopping.is_set():
            free = self.concurrency - len(self.inflight)
            # claim when half the slots are free (or none is busy), not for each one that frees up:
            # a claim is a statement on the dispatcher's one database thread
            if free <= 0 or (self.inflight and free < max(1, self.concurrency // 2)):
                self.capacity.clear()
                await _wait_any(self.capacity, stopping, None)
                continue
            if self.busy() and (wait := last_claim + BUSY_INTERVAL - time.monotonic()) > 0:
                await _wait_any(stopping, None, wait)
                continue
            last_claim = time.monotonic()
            self.wake.clear()
            token = uuid.uuid4()
            try:
                claimed = await self.db(_claim, min(self.batch_size, free), self.lease_seconds, token)
            except SessionLost as exc:
                delay = outage.next()
                logger.warning("database unavailable while claiming events (%s); retrying in %.2fs", exc, delay)
                await _wait_any(stopping, None, delay)
                continue
            except Exception:  # noqa: BLE001 - a bug here must not end the dispatcher's notifications
                logger.exception("claiming event deliveries failed")
                await _wait_any(stopping, None, MAX_POLL)
                continue
            outage.reset()
            if stopping.is_set():
                self._give_back(claimed)
                return
            for item in claimed:
                self._start(item)
            if claimed or claimed.opened:  # opened: events made, the next claim fans them out
                poll = MIN_POLL
                continue
            if once_after is not None and once_after.is_set() and not self.inflight and not self.results:
                return
            if once_after is not None and once_after.is_set():
                poll = MIN_POLL  # --once: finishing what is in flight (its retries may fall due)
            started = time.monotonic()
            await _wait_any(self.wake, stopping, poll)
            rest = MIN_POLL - (time.monotonic() - started)  # at most one empty claim per MIN_POLL
            if rest > 0 and not stopping.is_set():
                await _wait_any(stopping, None, rest)
            poll = MIN_POLL if self.wake.is_set() else min(poll * 2, MAX_POLL)

    async def _record_loop(self) -> None:
        while True:
            await self.record_wake.wait()
            self.record_wake.clear()
            await asyncio.sleep(GATHER_SECONDS)
            # behind a backlog of notifications: results gather for up to BUSY_INTERVAL (or a batch), so
            # the lane's records, like its claims, take the dispatcher's database thread once an interval
            held = time.monotonic() + BUSY_INTERVAL - GATHER_SECONDS
            while (self.busy() and len(self.results) < self.batch_size and not self.stopping.is_set()
                   and (left := held - time.monotonic()) > 0):  # fmt: skip
                self.record_wake.clear()
                await _wait_any(self.record_wake, self.stopping, left)
            if self.results:
                batch, self.results = self.results, []
                await self._record(batch)
            if self.stopping.is_set() and not self.results:
                return

    async def _record(self, batch: list[Result]) -> None:
        backoff = Backoff(first=0.05, cap=2.0)
        tries = 0
        while True:
            try:
                ours = await self.db(_record, batch)
                break
            except SessionLost as exc:
                tries += 1
                if self.stopping.is_set() and tries > 10:  # stopping: the leases give them back
                    logger.error("database unavailable; %d event results are left to their leases", len(batch))
                    return
                delay = backoff.next()
                logger.warning("database unavailable while recording %d event results (%s); retrying in %.2fs",
                               len(batch), exc, delay)  # fmt: skip
                await asyncio.sleep(delay)
            except Exception:  # noqa: BLE001 - the leases run out and the deliveries are tried again
                logger.exception("recording %d event results failed", len(batch))
                return
        lost = len(batch) - len(ours)
        if lost:
            logger.warning("%d event deliveries were re-claimed before we recorded them", lost)

    # --- sends ----------------------------------------------------------------------------------
    def _sender(self, item: Claimed) -> WebhookProvider:
        cached = self.signers.get(item.endpoint_id)
        if cached is not None and cached[0] == item.endpoint_version:
            return cached[1]
        secret = crypto.decrypt(item.secret_token, where=f"EventEndpoint.secret of row {item.endpoint_id}")
        options: dict[str, Any] = {}
        if item.previous_secret_token and item.secret_rotated_at is not None:
            from django.conf import settings

            previous = crypto.decrypt(item.previous_secret_token, where=f"EventEndpoint.previous_secret of row "
                                      f"{item.endpoint_id}")  # fmt: skip
            until = item.secret_rotated_at.timestamp() + float(settings.OMNIPOST_SECRET_ROTATION_GRACE_SECONDS)
            options = {"previous_secrets": {"signing_secret": previous}, "previous_until": until}
        sender = WebhookProvider(
            {"url": item.url, "timeout_seconds": TIMEOUT_SECONDS}, {"signing_secret": secret},
            http_client=self.client, **options,
        )  # fmt: skip
        self.signers[item.endpoint_id] = (item.endpoint_version, sender)
        return sender

    def _start(self, item: Claimed) -> None:
        started = datetime.now(UTC)
        t0 = time.perf_counter()

        def done(result: DeliveryResult) -> None:
            if self.inflight.pop(item.delivery_id, None) is None:
                return  # given back already
            self.capacity.set()
            self._judge(item, result, started, t0)

        try:
            handle = self._sender(item).start_post(item.event_id, item.body, done)
        except Exception as exc:  # noqa: BLE001 - recorded as a failed try, never lost
            logger.exception("could not start delivering event %s", item.event_id)
            self._judge(item, DeliveryResult(delivered=False, error_code="sender_crash", error_class=type(exc).__name__,
                                             permanent=False), started, t0)  # fmt: skip
            return
        self.inflight[item.delivery_id] = (handle, item)

    def _judge(self, item: Claimed, result: DeliveryResult, started: datetime, t0: float) -> None:
        decision = policy.decide_event(result, item.attempt, self.retry)
        self.attempted += 1
        if decision.kind == policy.DELIVERED:
            self.delivered += 1
        else:
            logger.info("event %s to endpoint %s: %s (%s)", item.event_id, item.endpoint_id, decision.kind,
                        decision.verdict.error_code)  # fmt: skip
        self.results.append(Result(
            item.delivery_id, item.lock_token, decision.kind, decision.retry_delay, result.http_status,
            decision.verdict.error_code[:100], int((time.perf_counter() - t0) * 1000), started,
        ))  # fmt: skip
        self.record_wake.set()

    def _give_back(self, items: list[Claimed]) -> None:
        self.results.extend(Result(i.delivery_id, i.lock_token, deliveries.DEFERRED) for i in items)
        self.record_wake.set()

    async def _drain(self, grace_seconds: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        while self.inflight and (left := deadline - loop.time()) > 0:
            self.capacity.clear()
            await _wait_any(self.capacity, None, left)
        if self.inflight:
            logger.warning("grace period over: giving back %d unfinished event deliveries", len(self.inflight))
            items = []
            for handle, item in list(self.inflight.values()):
                handle.cancel()
                items.append(item)
            self.inflight.clear()
            self._give_back(items)


def _claim(n: int, lease_seconds: float, token: uuid.UUID) -> deliveries.ClaimedBatch:
    """On the DB thread: the claim, through the hot path's prepared, server-side bound cursor."""
    with hot_cursor("default") as cursor:
        return deliveries.claim_due(n, lease_seconds, token, cursor=cursor)


def _record(batch: list[Result]) -> set[int]:
    with hot_cursor("default") as cursor:
        return deliveries.record(batch, cursor=cursor)


async def _wait_any(first: asyncio.Event, second: asyncio.Event | None, timeout: float | None) -> None:
    """Until either event is set or `timeout` passes."""
    waits = [asyncio.ensure_future(first.wait())]
    if second is not None:
        waits.append(asyncio.ensure_future(second.wait()))
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
