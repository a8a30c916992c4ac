"""Behind a transaction pooler: what a process may keep on its connection.

With `OMNIPOST_DATABASE_POOLER=pgbouncer` consecutive transactions of one Django connection may run
on different server connections (PgBouncer's transaction pooling; Debian 12's 1.18 has no
protocol-level prepared statements), so nothing may outlive a transaction: no statement is
prepared server-side (`prepare()`), no session `SET`, no session advisory lock, no LISTEN. LISTEN
goes to a direct connection, `OMNIPOST_LISTEN_DATABASE_URL`, when one is given; otherwise the
processes poll (`listen_params` is None). NOTIFY is transaction-scoped and goes through the pooler.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connections

# Django's connection parameters that a plain psycopg connection does not take.
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool")


def pooled() -> bool:
    """Whether Django's connections go through a transaction pooler."""
    return getattr(settings, "OMNIPOST_DATABASE_POOLER", "none") == "pgbouncer"


def prepare() -> bool:
    """The `prepare=` of the project's hot statements: prepared once per connection, unless pooled."""
    return not pooled()


def can_listen(alias: str) -> bool:
    """Whether `listen_params` gives a connection (cheap: asked on every request by core.auth_cache)."""
    return bool(getattr(settings, "OMNIPOST_LISTEN_DATABASE_URL", "")) or not pooled()


def listen_params(alias: str, application_name: str) -> dict[str, Any] | None:
    """psycopg connection parameters for a LISTEN connection, or None where LISTEN cannot work
    (pooled without `OMNIPOST_LISTEN_DATABASE_URL`): the caller polls instead."""
    if not can_listen(alias):
        return None
    direct = getattr(settings, "OMNIPOST_LISTEN_DATABASE_URL", "")
    params = {"conninfo": direct, "autocommit": True} if direct else notify_params(alias)
    params["application_name"] = application_name[:63]
    return params


def notify_params(alias: str) -> dict[str, Any]:
    """psycopg parameters of an autocommit connection like Django's own for `alias` (through the
    pooler where there is one: NOTIFY is transaction-scoped), with its application_name."""
    params = connections[alias].get_connection_params()
    for name in _DJANGO_ONLY:
        params.pop(name, None)
    params["autocommit"] = True
    return params
