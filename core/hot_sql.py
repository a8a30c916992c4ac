"""One hot statement on Django's PostgreSQL connection, with server-side binding and prepared once.

Django's psycopg cursors bind on the client (every parameter quoted into the SQL text) and never
prepare. For the API's create statement (about thirty parameters, several CTEs) that is ≈ 0.3 ms of
Python quoting and ≈ 0.25 ms of PostgreSQL planning per request. Here parameters travel as typed
values and the statement is prepared the first time a connection runs it (Django's own queries
are still never prepared). With OMNIPOST_DATABASE_POOLER=pgbouncer nothing is prepared (§17).

The statement stays visible to Django: it runs inside `wrap_database_errors` (psycopg errors become
django.db errors and mark the connection for Django's health rule) and is logged where Django logs
queries (DEBUG, CaptureQueriesContext), so statement counts in tests include it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections

from core import pooling

# psycopg's prepare_threshold: prepare only what asks (prepare=True). One less than the dispatcher's
# value (notifications.delivery), which also registers its array dumpers when it finds another one.
_ONLY_WHEN_ASKED = 2**31 - 2




def fetchone(
    sql: str, params: Sequence[Any] | Mapping[str, Any], *, using: str = "default"
) -> tuple[Any, ...] | None:
    """Run `sql` (psycopg placeholders, %s, or %(name)s with a mapping) and return its first row."""
    import psycopg

    connection = connections[using]
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    prepare = pooling.prepare()
    if prepare and raw.prepare_threshold is None:
        keep_generic_plans(raw, _ONLY_WHEN_ASKED)
    started = time.monotonic()
    with connection.wrap_database_errors, psycopg.Cursor(raw) as cursor:
        cursor.execute(sql, params, prepare=prepare)
        row = cursor.fetchone()
    if connection.queries_logged:
        # The parameters beside the text, as Django's log shows them bound into it (secrets are ciphertext).
        connection.queries_log.append({"sql": sql, "params": params, "time": f"{time.monotonic() - started:.3f}"})
    return row


def keep_generic_plans(raw: Any, threshold: int) -> None:  # noqa: ANN401 - a psycopg connection
    """Let `prepare=True` prepare (Django's prepare_threshold=None ignores it; `threshold` is the
    caller's) and keep each prepared statement's generic plan, made once (`plan_cache_mode`; the
    default `auto` re-plans a statement for its parameters whenever the generic plan's estimate is
    not the cheaper). Both only outside a transaction, where the `SET` cannot be rolled back: until
    then the statement runs unprepared. Also the dispatcher's (dispatch.delivery)."""
    from psycopg.pq import TransactionStatus

    if raw.info.transaction_status != TransactionStatus.IDLE:
        return
    raw.execute("SET plan_cache_mode = force_generic_plan")
    raw.prepare_threshold = threshold
