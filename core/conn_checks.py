"""Django's CONN_HEALTH_CHECKS, without a `SELECT 1` before every request of a busy process.

With persistent connections Django checks a reused connection with a round trip at the start of
each request (≈ 11 % of a single create's time under load). A connection that served a request
less than OMNIPOST_CONN_CHECK_IDLE_SECONDS ago, without an error, is taken as healthy: the check
stays for connections that sat idle (the case it exists for: a server restarted or a failover
while nobody asked) and after any database error (Django's own errors_occurred rule). A backend
killed in that second under load costs the one request that meets it, as it would with the check.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.signals import request_finished, request_started
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

_ATTR = "_omnipost_last_request_end"


def _started(**kwargs: Any) -> None:
    started()


def _finished(**kwargs: Any) -> None:
    finished()


def started(conns: Iterable[BaseDatabaseWrapper] | None = None) -> None:
    """At a request's start (also called directly by paths that bypass Django's handler, receipts.wsgi,
    with the initialized connections they already listed)."""
    idle = float(getattr(settings, "OMNIPOST_CONN_CHECK_IDLE_SECONDS", 0))
    if idle <= 0:
        return
    now = time.monotonic()
    for conn in connections.all(initialized_only=True) if conns is None else conns:
        last = getattr(conn, _ATTR, None)
        if conn.connection is not None and last is not None and now - last < idle and not conn.errors_occurred:
            conn.health_check_done = True


def finished(conns: Iterable[BaseDatabaseWrapper] | None = None) -> None:
    now = time.monotonic()
    for conn in connections.all(initialized_only=True) if conns is None else conns:
        setattr(conn, _ATTR, now)


def connect() -> None:
    # After django.db's close_old_connections (connected at import), which resets health_check_done.
    request_started.connect(_started, dispatch_uid="omnipost.conn_checks.started")
    request_finished.connect(_finished, dispatch_uid="omnipost.conn_checks.finished")
