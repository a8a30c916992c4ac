"""The dispatcher's background loops beside claiming: lease keeping, heartbeats, and the queue
janitor's maintenance. Each runs its SQL on the dispatcher's DB thread (`db`) and nothing but
the dispatcher's end stops it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from core.db_faults import Backoff, reconnects
from dispatch.delivery import Prepared
from dispatch.recording import SessionLost
from queueing import heartbeat, janitor, queue
from queueing.models import Worker

logger = logging.getLogger("omnipost.dispatcher")

HEARTBEAT_SECONDS = 5.0
MAINTENANCE_SECONDS = 2.0  # how often the janitor looks at the dead-row counts (janitor.Janitor.every)

Db = Callable[..., Awaitable[Any]]


async def keep_leases(db: Db, inflight: Mapping[int, tuple[Any, Prepared]], lease_seconds: float) -> None:
    """Extends the leases of sends in flight every third of a lease. A lost session is retried
    within a short backoff (not a whole interval later), so a send longer than its lease keeps
    it through an outage shorter than the lease's remaining time."""
    interval = max(0.2, lease_seconds / 3)
    backoff = Backoff(first=0.05, cap=interval)
    wait = interval
    while True:
        await asyncio.sleep(wait)
        wait = interval
        leases = [item.lease for _, item in inflight.values()]
        if not leases:
            continue
        try:
            kept = await db(queue.extend, leases, lease_seconds)
        except SessionLost as exc:
            wait = backoff.next()
            logger.warning("could not extend %d leases (%s); retrying in %.2fs", len(leases), exc, wait)
            continue
        except Exception:  # noqa: BLE001 - a bug here must not end lease keeping for good
            logger.exception("extending %d leases failed", len(leases))
            continue
        backoff.reset()
        if len(kept) < len(leases):
            logger.warning("%d lease(s) were lost before they could be extended", len(leases) - len(kept))


async def beat(db: Db, worker: Worker, processed: Callable[[], int], every: float = HEARTBEAT_SECONDS) -> None:
    reported = 0
    while True:
        await asyncio.sleep(every)
        done = processed()
        try:
            await db(heartbeat.beat, worker, done - reported, reconnects())
        except Exception as exc:  # noqa: BLE001 - a missed beat is retried at the next one
            logger.warning("heartbeat failed (%s)", exc if isinstance(exc, SessionLost) else repr(exc))
            continue
        reported = done


async def sweep_providers(db: Db, sweep: Callable[[], int], every: float) -> None:
    """The provider cache's sweep (dispatch.providers) on the DB thread every `every` seconds: the
    instances of providers deleted since they were claimed are closed even if no claim names them."""
    while True:
        await asyncio.sleep(every)
        try:
            await db(sweep)
        except Exception as exc:  # noqa: BLE001 - tried again at the next sweep
            logger.warning("provider sweep failed (%s)", exc if isinstance(exc, SessionLost) else repr(exc))


async def maintain(db: Db, every: float = MAINTENANCE_SECONDS, keeper: janitor.Janitor | None = None) -> None:
    """The queue janitor (VACUUM of the churning tables once dead rows pile up), on the DB thread
    between claims: one cheap look at the statistics every `every` seconds."""
    keeper = keeper or janitor.Janitor(every=0.0)
    while True:
        await asyncio.sleep(every)
        try:
            await db(janitor.vacuum_on_default, keeper)
        except Exception as exc:  # noqa: BLE001 - maintenance waits for the next round
            logger.warning("queue maintenance failed (%s)", exc if isinstance(exc, SessionLost) else repr(exc))
