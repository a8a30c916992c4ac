"""One policy for a lost database session, used by every long-running loop.

A terminated backend (`pg_terminate_backend`, a pooler's idle timeout), a PostgreSQL restart or a
failover all surface as exceptions from whichever driver layer the loop used: psycopg's own
(the dispatcher's hot path runs on a raw psycopg cursor, the doorbell on a plain psycopg
connection) or Django's wrappers of them. `is_connection_lost` recognises all of them; the loop
then calls `reset_connection` (Django reconnects on the next query), waits `Backoff.next()` and
goes on. Nothing here ever decides to exit.

`Backoff` is capped exponential backoff with full jitter (so a restart does not make every process
reconnect in the same millisecond); `reconnects()` counts, per process, how many times a loop had to
reconnect (the heartbeat reports it, `/metrics` sums it).
"""

from __future__ import annotations

import contextlib
import random
import threading
from dataclasses import dataclass, field

import psycopg
from django.db import InterfaceError as DjangoInterfaceError
from django.db import OperationalError as DjangoOperationalError
from django.db import connections

# SQLSTATEs that mean "this session can no longer be used; another one can": connection
# exceptions (class 08), administrator/crash shutdown and "cannot connect now" (57P01-57P03),
# too many connections (53300), a read-only session (25006: a standby, until failover reaches the
# promoted primary) and an idle-in-transaction timeout (25P03).
_LOST_CLASSES = ("08",)
_LOST_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "25006", "25P03"})

_LOST_TYPES: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    DjangoOperationalError,
    DjangoInterfaceError,
)


def is_connection_lost(exc: BaseException) -> bool:
    """True for any error a driver raises when its session is gone or unusable (and for the
    operational errors that a fresh session retries: a cancelled statement, a deadlock)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:  # Django chains the psycopg error as __cause__
        if isinstance(current, _LOST_TYPES):
            return True
        state = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if isinstance(state, str) and (state in _LOST_STATES or state.startswith(_LOST_CLASSES)):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False


_counter_lock = threading.Lock()
_reconnects = 0


def count_reconnect() -> None:
    global _reconnects
    with _counter_lock:
        _reconnects += 1


def reconnects() -> int:
    """How many times this process dropped a lost session to reconnect."""
    return _reconnects


def reset_connection(alias: str = "default") -> None:
    """Drop the calling thread's Django connection after a loss (the next query opens a new one)
    and count the reconnect. Never raises: the old socket may be half-closed already."""
    count_reconnect()
    connection = connections[alias]
    with contextlib.suppress(Exception):
        connection.close()
    if not connection.in_atomic_block:
        connection.connection = None  # even if close() raised half-way


@dataclass
class Backoff:
    """Capped exponential backoff with full jitter: `next()` is a delay in [first/2, cap]."""

    first: float = 0.05
    cap: float = 5.0
    _attempt: int = field(default=0, init=False)

    def next(self) -> float:
        ceiling = min(self.cap, self.first * (2**self._attempt))
        self._attempt = min(self._attempt + 1, 30)
        return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not crypto

    def reset(self) -> None:
        self._attempt = 0

    @property
    def failing(self) -> bool:
        return self._attempt > 0
