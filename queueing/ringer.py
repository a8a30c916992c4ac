"""Doorbells rung off the caller's path: one thread and connection per process send the NOTIFYs.

A create used to send its wake-up (`SELECT pg_notify(…)`) on its own connection right after its
commit: a second round trip per request, ≈ 90 µs of the web process's CPU and a context switch,
while under load the dispatchers were awake anyway. Now `ring` only records the (channel, payload)
and wakes this process's ringer thread, which sends everything recorded since its last statement
in one statement on its own autocommit connection (`pooling.notify_params`: through the pooler,
where there is one; NOTIFY is transaction-scoped). Identical rings coalesce, and a channel may keep
one payload (`merge`: the schedulers only need the earliest run_at). A ringer that sent less than
`LINGER` ago waits out the rest first, so a busy process sends at most 1 / LINGER statements a
second; an idle one sends at once.

Ordering: `ring` is called after the ringing transaction commits (queue.ring_after_commit), so a
woken listener finds the rows. A lost connection keeps the rings and retries with capped, jittered
backoff (core.db_faults.Backoff); a wake-up that never arrives costs its listener one polling
interval, as a crash between commit and NOTIFY always could. At interpreter exit the ringer sends
what is pending (at most `EXIT_WAIT`).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable

from core import pooling
from core.db_faults import Backoff, count_reconnect

logger = logging.getLogger("omnipost.ringer")

# Seconds between two statements of one ringer, at least: a process ringing more often than this sends
# one statement per LINGER, each ring waiting at most that long (and a listener that is busy does not
# need it). Fewer statements free the web process's CPU for requests: 10 ms costs less server CPU a
# create than 2 ms did (docs/PERFORMANCE.md).
LINGER = 0.010
EXIT_WAIT = 2.0

_SEND = "SELECT count(pg_notify(r.channel, r.payload)) FROM unnest(%s::text[], %s::text[]) AS r(channel, payload)"

# channel -> merge(kept payload, new payload) -> the one payload to keep
_MERGES: dict[str, Callable[[str, str], str]] = {}


def merge(channel: str, keep: Callable[[str, str], str]) -> None:
    """Rings of `channel` coalesce into one payload, `keep(older, newer)`, until they are sent."""
    _MERGES[channel] = keep


class Ringer:
    """Sends the rings of one process for one database alias, from a daemon thread."""

    def __init__(self, alias: str, *, linger: float = LINGER) -> None:
        self.alias = alias
        self.linger = linger
        self.statements = 0  # statements sent (tests, benchmarks)
        self.backend_pid: int | None = None  # of its connection (tests)
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, None]] = {}
        self._in_flight = False  # a taken batch is not yet settled
        self._wake = threading.Event()
        self._done = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._params: dict | None = None
        self._closing = False

    def ring(self, channel: str, payload: str) -> None:
        with self._lock:
            self._add(channel, payload)
            if self._params is None:
                # the caller's settings (a test database's); a connect never hangs the rings for long
                self._params = {"connect_timeout": 10, **pooling.notify_params(self.alias)}
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"ringer-{self.alias}", daemon=True)
                self._thread.start()
        self._wake.set()

    def flush(self, timeout: float) -> bool:
        """Wait until every ring so far is sent (or `timeout` passes); whether it was."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._done.wait(left)
        return True

    def close(self, timeout: float = EXIT_WAIT) -> None:
        """Send what is pending, then stop the thread and close its connection (a later ring starts
        them again): for a test database about to be dropped, and at exit."""
        self.flush(timeout)
        with self._lock:
            thread, self._closing = self._thread, True
        if thread is not None:
            self._wake.set()
            thread.join(timeout)
        with self._lock:
            self._closing = False
            if self._thread is thread:
                self._thread = None

    def _add(self, channel: str, payload: str) -> None:
        kept = self._pending.get(channel)
        keep = _MERGES.get(channel)
        if kept is None:
            self._pending[channel] = {payload: None}
        elif keep is None:
            kept[payload] = None
        else:
            self._pending[channel] = {keep(next(iter(kept)), payload): None}

    def _take(self) -> dict[str, dict[str, None]]:
        with self._lock:
            batch, self._pending = self._pending, {}
            self._in_flight = bool(batch)
            return batch

    def _settle(self, failed: dict[str, dict[str, None]] | None) -> None:
        with self._lock:
            for channel, payloads in (failed or {}).items():
                for payload in payloads:
                    self._add(channel, payload)
            self._in_flight = False  # a taken batch is not yet settled
            self._done.notify_all()

    def _run(self) -> None:
        import psycopg

        conn: psycopg.Connection | None = None
        backoff = Backoff(first=0.05, cap=2.0)  # between failed statements, jittered
        last = 0.0
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                if conn is not None:
                    conn.close()
                return
            since = time.monotonic() - last
            if since < self.linger:
                time.sleep(self.linger - since)
            batch = self._take()
            if not batch:
                self._settle(None)
                continue
            channels = [c for c, payloads in batch.items() for _ in payloads]
            payloads = [p for kept in batch.values() for p in kept]
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(**self._params)
                    self.backend_pid = conn.info.backend_pid
                conn.execute(_SEND, [channels, payloads], prepare=pooling.prepare())
            except Exception as exc:  # noqa: BLE001 - any failure: keep the rings, reconnect, retry
                count_reconnect()
                delay = backoff.next()
                logger.warning("doorbell connection failed (%s); retrying in %.2fs", type(exc).__name__, delay)
                if conn is not None:
                    conn.close()
                conn = None
                self._settle(batch)
                time.sleep(delay)
                self._wake.set()
                continue
            backoff.reset()
            last = time.monotonic()
            self.statements += 1
            self._settle(None)


_ringers: dict[str, Ringer] = {}
_ringers_pid = os.getpid()
_ringers_lock = threading.Lock()


def ringer(alias: str = "default") -> Ringer:
    """This process's ringer for `alias` (a forked child gets its own)."""
    global _ringers, _ringers_pid
    found = _ringers.get(alias)
    if found is not None and _ringers_pid == os.getpid():
        return found
    with _ringers_lock:
        if _ringers_pid != os.getpid():
            _ringers, _ringers_pid = {}, os.getpid()
        return _ringers.setdefault(alias, Ringer(alias))


def ring(channel: str, payload: str, using: str = "default") -> None:
    ringer(using).ring(channel, payload)


@atexit.register
def close_all() -> None:
    """Send what every ringer of this process holds and close their connections."""
    if _ringers_pid == os.getpid():
        for each in list(_ringers.values()):
            each.close()
