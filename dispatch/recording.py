"""Outcomes, written in batches: one record statement per batch (dispatch.delivery), then the
rate buckets learn from 429s and successes of limited providers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from core.db_faults import Backoff, is_connection_lost, reset_connection
from dispatch.delivery import DispatchLease, Outcome, Recorded, record_accepted, record_outcomes
from dispatch.providers import ProviderCache
from providers import simulator
from queueing import ratelimit

logger = logging.getLogger("omnipost.dispatcher")

GATHER_SECONDS = 0.002  # let a few more outcomes join a batch


class SessionLost(Exception):  # noqa: N818 - a state, not a bug
    """The database session was lost while the DB thread ran a call; the connection is already
    dropped (the next call reconnects). Raised by `Dispatcher.db`, caught by every loop."""


class Recorder:
    def __init__(
        self, db: Callable[..., Awaitable[Any]], providers: ProviderCache, on_bug: Callable[[], None]
    ) -> None:
        self.db = db
        self.providers = providers
        self.on_bug = on_bug  # recording is broken: the dispatcher must stop claiming
        self.pending: list[Outcome] = []
        self.accepted: list[tuple[DispatchLease, Any, int | None]] = []  # devices that accepted a push still in flight
        self.wake = asyncio.Event()
        self.finished = asyncio.Event()
        self.force = False  # a forced stop abandons what cannot be written now
        self.processed = 0
        self.after_write: Callable[[Recorded], None] | None = None  # told of each batch written
        # on the DB thread, right after each record statement: the breaker states it returned (the router's learn)
        self.on_breakers: Callable[[dict[int, str]], None] | None = None

    def add(self, outcome: Outcome) -> None:
        self.pending.append(outcome)
        self.wake.set()

    def accept(self, lease: DispatchLease, device_id: Any, provider_id: int | None = None) -> None:  # noqa: ANN401
        """A device accepted its push (through `provider_id`) while the push's other devices are still
        being sent to."""
        self.accepted.append((lease, device_id, provider_id))
        self.wake.set()

    def extend(self, outcomes: Iterable[Outcome]) -> None:
        self.pending.extend(outcomes)
        self.wake.set()

    async def run(self) -> None:
        """Writes outcomes in batches until the dispatcher has finished and nothing is left."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            await asyncio.sleep(GATHER_SECONDS)
            if self.accepted:
                accepted, self.accepted = self.accepted, []
                await self._record_accepted(accepted)
            if self.pending:
                batch, self.pending = self.pending, []
                await self._record(batch)
            if self.finished.is_set() and not self.pending:
                return

    async def _record_accepted(self, accepted: list[tuple[DispatchLease, Any, int | None]]) -> None:
        """Written before the outcomes gathered with them; if the session is lost, the push's outcome
        records them all the same (only a dispatcher that dies before that may send them again)."""
        try:
            await self.db(record_accepted, accepted)
        except SessionLost as exc:
            logger.warning("database unavailable while recording %d accepted devices (%s)", len(accepted), exc)
        except Exception:  # noqa: BLE001 - the push's outcome records them all the same
            logger.exception("recording %d accepted devices failed", len(accepted))

    async def _record(self, batch: list[Outcome]) -> None:
        backoff = Backoff(first=0.05, cap=2.0)
        while True:
            try:
                recorded = await self.db(self.write, batch)
                break
            except SessionLost as exc:
                # Kept in memory and written once a session is back: the record is fenced by the
                # lock tokens, so a lease still ours is recorded once (never re-sent) and one that
                # expired meanwhile is refused. A record that did commit before the loss finds its
                # rows gone the second time and writes nothing again.
                if self.force:
                    logger.error("database unavailable; abandoning %d outcomes on a forced stop", len(batch))
                    return
                delay = backoff.next()
                logger.warning("database unavailable while recording %d outcomes (%s); retrying in %.2fs",
                               len(batch), exc, delay)
                await asyncio.sleep(delay)
            except Exception:
                # A bug, not an outage: sending on while outcomes cannot be written would resend
                # everything when the leases expire. Stop claiming and exit non-zero instead.
                logger.exception("recording %d outcomes failed; the dispatcher stops", len(batch))
                self.on_bug()
                return
        if recorded.lost:
            logger.warning("%d item(s) were re-claimed by a peer before we recorded them", len(recorded.lost))
        if self.after_write is not None:
            self.after_write(recorded)
        self.processed += sum(1 for o in batch if o.kind != "deferred") - len(recorded.lost)

    @staticmethod
    def _report_simulated(batch: list[Outcome], recorded: Recorded) -> None:
        """The receipts the simulator reports for the test notifications it accepted (recorded now, so a
        receipt never precedes its delivery), applied by the receipt service as a vendor's are."""
        receipts = [o.simulated for o in batch if o.simulated is not None and o.lease.item_id in recorded.ours]
        if not receipts:
            return
        try:
            simulator.report(receipts)
        except Exception as exc:  # the outcomes are written; a simulated receipt is not worth stopping for
            if is_connection_lost(exc):
                reset_connection()
            logger.exception("applying %d simulated receipts failed", len(receipts))

    def write(self, batch: list[Outcome]) -> Recorded:
        """On the DB thread: the record statement, then what the rate buckets learn from it."""
        recorded = record_outcomes(batch)
        self._report_simulated(batch, recorded)
        if recorded.breakers and self.on_breakers is not None:
            self.on_breakers(recorded.breakers)
        throttled, succeeded = set(), set()
        for o in batch:
            if not (o.attempt and self.providers.limited(o.lease.provider_id)):
                continue
            if o.attempt.http_status == 429:
                throttled.add(o.lease.provider_id)
            elif o.kind == "delivered":
                succeeded.add(o.lease.provider_id)
        if throttled or succeeded:
            try:
                ratelimit.adapt(throttled, succeeded)
            except Exception as exc:  # the outcomes are written; adapting the rate can wait
                if not is_connection_lost(exc):
                    raise
                reset_connection()
        return recorded
