"""core.hot_sql: a long statement's placeholders are converted once, by psycopg's rules."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core import hot_sql

PAD = " ".join(f"/* {i:04} */" for i in range(500))  # beyond psycopg's 4 KiB cache


def test_numbered_follows_psycopgs_placeholder_rules():
    text, names = hot_sql._numbered("SELECT %(a)s, %(b)s, %(a)s, 7 %% 3, '%%'")
    assert (text, names) == ("SELECT $1, $2, $1, 7 % 3, '%'", ("a", "b"))
    assert hot_sql._numbered("SELECT %s, %s") == ("SELECT $1, $2", None)
    with pytest.raises(ValueError, match="not both"):
        hot_sql._numbered("SELECT %s, %(a)s")


@pytest.mark.django_db
@pytest.mark.parametrize("pad", ["", PAD], ids=["short", "long"])
def test_named_and_positional_statements_answer_alike_short_or_long(pad):
    named = f"SELECT %(x)s::int * %(y)s::int, %(x)s::int, %(t)s::text, 7 %% 4 {pad}"
    positional = f"SELECT %s::int * %s::int, %s::text {pad}"
    assert (len(named) > hot_sql._PSYCOPG_CACHES_UP_TO) == bool(pad)
    with CaptureQueriesContext(connection) as queries:
        assert hot_sql.fetchone(named, {"x": 6, "y": 7, "t": "ünï"}) == (42, 6, "ünï", 3)
        assert hot_sql.fetchone(positional, [3, 5, None]) == (15, None)
        assert hot_sql.fetchone(named, {"t": "b", "y": 2, "x": 1}) == (2, 1, "b", 3)  # the same text again
    assert [q["sql"] for q in queries] == [named, positional, named], "logged as written, for statement counts"


@pytest.mark.django_db
@pytest.mark.parametrize("pad", ["", PAD], ids=["short", "long"])
def test_binary_parameters_short_or_long(pad):
    """`%b` (a batch create's arrays): psycopg's conversion, which alone knows a parameter's format."""
    import uuid

    ids = [uuid.uuid4(), uuid.uuid4()]
    sql = f"SELECT array_length(%b::uuid[], 1), (%b::uuid[])[2], %(t)s::text, %(n)b::int[] {pad}"
    assert hot_sql._binary(sql) and not hot_sql._binary(f"SELECT '%%b', %s {pad}")
    named = sql.replace("%b::uuid[], 1", "%(ids)b::uuid[], 1").replace("(%b::uuid[])[2]", "(%(ids)b::uuid[])[2]")
    assert hot_sql.fetchone(named, {"ids": ids, "t": "x", "n": [1, None]}) == (2, ids[1], "x", [1, None])
    assert hot_sql.fetchone(f"SELECT %b::text[] {pad}", [["a", None, "ü"]]) == (["a", None, "ü"],)


@pytest.mark.django_db
def test_a_long_statements_errors_are_djangos():
    from django.db import DataError

    with pytest.raises(DataError):
        hot_sql.fetchone(f"SELECT %s::int {PAD}", ["not a number"])


@pytest.mark.django_db(transaction=True)
def test_a_connection_keeps_its_cursor_across_statements_errors_and_a_reconnect():
    from django.db import DataError

    connection.close()  # from a new connection on
    assert hot_sql.fetchone("SELECT %s::int[]", [[1, 2]]) == ([1, 2],)
    raw, kept = getattr(connection, hot_sql._CURSORS)
    [cursor] = kept.values()
    with pytest.raises(DataError):
        hot_sql.fetchone("SELECT %s::int", ["not a number"])
    assert hot_sql.fetchone("SELECT %s::text[], now() > %s", [["a"], "2000-01-01T00:00:00Z"]) == (["a"], True)
    assert getattr(connection, hot_sql._CURSORS)[1] == {type(cursor): cursor}, "the same cursor, after an error too"
    connection.close()
    assert raw.closed
    assert hot_sql.fetchone("SELECT %s::int + 1", [41]) == (42,)
    assert getattr(connection, hot_sql._CURSORS)[0] is connection.connection is not raw, "a new connection's cursor"
