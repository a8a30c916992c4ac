"""One hot statement on Django's PostgreSQL connection, with server-side binding and prepared once.

Django's psycopg cursors bind on the client (every parameter quoted into the SQL text) and never
prepare. For the API's create statement (about thirty parameters, several CTEs) that is ≈ 0.3 ms of
Python quoting and ≈ 0.25 ms of PostgreSQL planning per request. Here parameters travel as typed
values and the statement is prepared the first time a connection runs it (Django's own queries
are still never prepared). With OMNIPOST_DATABASE_POOLER=pgbouncer nothing is prepared.

The statement stays visible to Django: it runs inside `wrap_database_errors` (psycopg errors become
django.db errors and mark the connection for Django's health rule) and is logged where Django logs
queries (DEBUG, CaptureQueriesContext), so statement counts in tests include it. Texts longer
than psycopg caches the placeholder conversion of (4 KiB: the receipts statement) are converted
here once (`_numbered`) and run through a `RawCursor`, unless they bind something in binary
(`%b`: a batch create's arrays), which only psycopg's own conversion can say.
"""

from __future__ import annotations

import functools
import re
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
    if len(sql) > _PSYCOPG_CACHES_UP_TO and not _binary(sql):
        text, names = _numbered(sql)
        values = [params[name] for name in names] if names is not None else params
        with connection.wrap_database_errors:
            cursor = _cursor(connection, raw, psycopg.RawCursor)
            cursor.execute(text, values, prepare=prepare)
            row = cursor.fetchone()
    else:
        with connection.wrap_database_errors:
            cursor = _cursor(connection, raw, psycopg.Cursor)
            cursor.execute(sql, params, prepare=prepare)
            row = cursor.fetchone()
    if connection.queries_logged:
        # The parameters beside the text, as Django's log shows them bound into it (secrets are ciphertext).
        connection.queries_log.append({"sql": sql, "params": params, "time": f"{time.monotonic() - started:.3f}"})
    return row


_CURSORS = "_omnipost_hot_cursors"


def _cursor(connection: Any, raw: Any, kind: type) -> Any:  # noqa: ANN401 - Django's wrapper, psycopg's objects
    """One cursor of `kind` per psycopg connection, kept on Django's (per-thread) connection wrapper:
    a cursor's transformer keeps the loaders and dumpers it made, by type, so a statement returning
    some fifty columns does not instantiate fifty loaders on every execute (a new cursor a call
    spent ≈ 10 % of a detail read's Python on that). A new connection gets new cursors."""
    kept = getattr(connection, _CURSORS, None)
    if kept is None or kept[0] is not raw:
        kept = (raw, {})
        setattr(connection, _CURSORS, kept)
    cursor = kept[1].get(kind)
    if cursor is None or cursor.closed:
        cursor = kept[1][kind] = kind(raw)
    return cursor


_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)s|%s")
_BINARY = re.compile(r"(?<!%)%(\(\w+\))?b")
# psycopg converts its placeholders once per text up to this length (psycopg._queries'
# MAX_CACHED_STATEMENT_LENGTH, 4096 bytes in 3.3) and on every execute beyond it
_PSYCOPG_CACHES_UP_TO = 4096


@functools.lru_cache(maxsize=64)
def _binary(sql: str) -> bool:
    """Does `sql` bind a parameter in binary (`%b`, `%(name)b`)? Then psycopg converts it (on every
    execute if it is long): a raw `$n` carries no format, and psycopg would dump it as text."""
    return _BINARY.search(sql) is not None


@functools.lru_cache(maxsize=64)
def _numbered(sql: str) -> tuple[str, tuple[str, ...] | None]:
    """`sql` with psycopg's placeholders (`%s`, or `%(name)s`; `%%` for `%`) turned into the server's
    `$1, $2, …`, and for named ones the names in their order (None: positional), once per text.
    For texts longer than psycopg caches its own conversion of (it re-parses them on every execute
    with regular expressions; its cache is for short texts, ORMs' long ones rarely repeat): the
    5.4 KB receipts statement's conversion cost ≈ 100 µs of a ≈ 280 µs call (`time.process_time`,
    2,000 calls in process); with it done once, a long text costs what a short one does."""
    names: list[str] = []
    positional = 0

    def number(match: re.Match[str]) -> str:
        nonlocal positional
        if match[0] == "%%":
            return "%"
        if match[1] is None:
            positional += 1
            return f"${positional}"
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    text = _PLACEHOLDER.sub(number, sql)
    if names and positional:
        raise ValueError("a statement takes %s or %(name)s placeholders, not both")
    return text, tuple(names) if names else None


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
