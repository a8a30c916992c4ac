"""core.pg_arrays: what the bulk encoders send is what PostgreSQL reads back, type by type."""

from __future__ import annotations

import struct
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection

from core import pg_arrays

pytestmark = pytest.mark.django_db

TOKEN = uuid.uuid4()
NOW = datetime.now(UTC)


@pytest.fixture
def cursor():
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cur:
        pg_arrays.register(cur.adapters)
        yield cur


@pytest.mark.parametrize(
    ("encode", "sql_type", "values"),
    [
        (pg_arrays.int8s, "bigint[]", [1, 0, -1, 2**62, -(2**63)]),
        (pg_arrays.int8s, "bigint[]", [None, 7, None]),
        (pg_arrays.int4s, "int[]", [200, -5, 2**31 - 1, None]),
        (pg_arrays.float8s, "float8[]", [0.0, 1.5, -2.25, 1e300, None]),
        (pg_arrays.texts, "text[]", ["delivered", "", "délivré ✓", 'q"{x},\\y', None, "delivered", "x" * 5000]),
        (pg_arrays.uuids, "uuid[]", [TOKEN, TOKEN, uuid.uuid4(), None]),
        (
            pg_arrays.timestamptzs,
            "timestamptz[]",
            [NOW, NOW - timedelta(days=9000, microseconds=3), datetime(1999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)],
        ),
        (pg_arrays.texts, "text[]", []),
        (pg_arrays.int8s, "bigint[]", []),
        # one value throughout (a batch's kinds, codes, lock token): encoded once and repeated
        (pg_arrays.texts, "text[]", ["delivered"] * 600),
        (pg_arrays.texts, "text[]", [""] * 3),
        (pg_arrays.texts, "text[]", [None] * 4),
        (pg_arrays.uuids, "uuid[]", [TOKEN] * 500),
        (pg_arrays.uuids, "uuid[]", [None, None]),
        # equal values that are different objects, and a change of value at the very end
        (pg_arrays.uuids, "uuid[]", [uuid.UUID(str(TOKEN)) for _ in range(3)] + [uuid.uuid4()]),
        (pg_arrays.texts, "text[]", ["a"] * 9 + ["b"]),
    ],
)
def test_an_encoded_array_reads_back_as_the_values(cursor, encode, sql_type, values):
    cursor.execute(f"SELECT %b::{sql_type}, cardinality(%b::{sql_type})", [encode(values), encode(values)])
    read, count = cursor.fetchone()
    assert read == values and count == len(values)


def test_encoded_arrays_unnest_side_by_side(cursor):
    ids, kinds = pg_arrays.int8s([3, 1, 2]), pg_arrays.texts(["a", "b", None])
    cursor.execute("SELECT i, k FROM unnest(%b::bigint[], %b::text[]) AS t(i, k) ORDER BY i", [ids, kinds])
    assert cursor.fetchall() == [(1, "b"), (2, None), (3, "a")]


def test_an_array_is_sent_with_its_own_type(cursor):
    """No cast in the SQL: the parameter's OID alone makes it an int8[] (not text, not int4[])."""
    cursor.execute("SELECT pg_typeof(%b)::text", [pg_arrays.int8s([1])])
    assert cursor.fetchone()[0] == "bigint[]"


def test_values_out_of_the_types_range_are_refused_before_sending():
    with pytest.raises(struct.error):
        pg_arrays.int4s([2**31])
