"""Low-latency wake-ups: LISTEN on a dedicated autocommit psycopg connection.

Notifications carry queue names only and merely wake a loop, which then reads the table; polling
stays the fallback. The connection is re-established with backoff after errors, and LISTEN is
re-issued each time. Behind PgBouncer (transaction pooling loses LISTEN) it is
`OMNIPOST_LISTEN_DATABASE_URL`'s, or there is none and the loops poll alone (core.pooling).

A ring may be answered on the doorbell's own connection (`answer`, given the connection and the
payload): its server process is awake the moment the notification arrives, where the woken loop's
connection would first have to wake its own. The dispatcher claims there (unless a claim is under way), on a
direct connection only (dispatch.claims); when `answer` declines, `on_ring` wakes the loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from core import pooling
from core.db_faults import count_reconnect
from queueing.queue import NOTIFY_CHANNEL

logger = logging.getLogger("omnipost.wakeup")


def _conninfo(alias: str, application_name: str) -> dict | None:
    """psycopg parameters of the LISTEN connection (core.pooling: the direct
    OMNIPOST_LISTEN_DATABASE_URL behind a pooler), or None where only polling works."""
    return pooling.listen_params(alias, application_name)


class Doorbell:
    """Calls `on_ring(payload)` from a background thread whenever a NOTIFY arrives on `channel`."""

    def __init__(
        self,
        on_ring: Callable[[str], None],
        *,
        channel: str = NOTIFY_CHANNEL,
        using: str = "default",
        application_name: str | None = None,
        answer: Callable[[object, str], bool] | None = None,
    ) -> None:
        self.on_ring = on_ring
        # Tried first for each ring, with the LISTEN connection; False falls back to `on_ring`. An
        # exception it raises ends the connection (the loop reconnects and LISTENs again).
        self.answer = answer
        self.channel = channel
        name = application_name or f"omnipost-listen-{socket.gethostname()}-{os.getpid()}"
        self._params = _conninfo(using, name)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()

    @property
    def available(self) -> bool:
        return self._params is not None

    def start(self) -> Doorbell:
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"doorbell-{self.channel}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        import psycopg
        from psycopg import sql

        backoff = 0.1
        while not self._stop.is_set():
            try:
                with psycopg.connect(**self._params) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.connected.set()
                    backoff = 0.1
                    while not self._stop.is_set():
                        # out of the generator (it holds the connection's lock) before `answer` uses it
                        payloads = [note.payload for note in conn.notifies(timeout=0.5, stop_after=1)]
                        for payload in payloads:
                            if self.answer is None or not self.answer(conn, payload):
                                self.on_ring(payload)
            except Exception as exc:  # noqa: BLE001 - reconnect after any connection failure
                count_reconnect()
                self.connected.clear()
                logger.warning("LISTEN connection failed (%s); retrying in %.1fs", type(exc).__name__, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
