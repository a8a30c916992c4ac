"""One-dimensional PostgreSQL arrays in binary, encoded in bulk for the dispatcher's record statement.

psycopg dumps a list parameter element by element in Python (a dumper call, a length, two appends).
These encoders build the same binary format (`array_recv`'s) with one `struct` call per array for
fixed-width types, and one encoding per distinct value for text and uuid (a batch's texts and lock
tokens are nearly all alike). Measured side by side (2026-12-01, `bench/pg_arrays_bench.py 500`: the
record's 17 arrays for a batch of 500, dumped by psycopg's Transformer): 6.2 µs per delivery here
against 29.3 µs with psycopg's own list dumpers, a gain far beyond the end-to-end benchmark's noise,
so this hand-written part stays. `tests/core/test_pg_arrays.py` holds it to what PostgreSQL reads back.

Pass `int8s(values)`, `texts(values)`, … as a parameter; `register(adapters)` teaches a psycopg
connection (or cursor) to send them as they are, with the array type's OID, in binary.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from psycopg import postgres
from psycopg.adapt import Dumper
from psycopg.pq import Format

# OIDs of the element types and of their arrays, from psycopg's registry of PostgreSQL's built-in types.
_INT4, _INT8, _FLOAT8, _TEXT, _UUID, _TIMESTAMPTZ = (
    postgres.types[name].oid for name in ("int4", "int8", "float8", "text", "uuid", "timestamptz")
)
_ARRAY_OID = {oid: postgres.types[oid].array_oid for oid in (_INT4, _INT8, _FLOAT8, _TEXT, _UUID, _TIMESTAMPTZ)}

_HEADER = struct.Struct(">iiIii")  # dimensions, has nulls, element oid; then (length, lower bound)
_LENGTH = struct.Struct(">i")
_NULL = _LENGTH.pack(-1)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class BinaryArray(bytes):
    """An encoded array: its bytes and the OID of its array type."""

    __slots__ = ()
    oid: int


def _array_class(element_oid: int) -> type[BinaryArray]:
    return type(f"BinaryArray{element_oid}", (BinaryArray,), {"__slots__": (), "oid": _ARRAY_OID[element_oid]})


_CLASSES = {oid: _array_class(oid) for oid in _ARRAY_OID}


def _finish(element_oid: int, count: int, has_null: bool, body: bytes) -> BinaryArray:
    if not count:  # an empty array has no dimensions
        return _CLASSES[element_oid](struct.pack(">iiI", 0, 0, element_oid))
    return _CLASSES[element_oid](_HEADER.pack(1, int(has_null), element_oid, count, 1) + body)


@lru_cache(maxsize=64)
def _fixed(code: str, count: int) -> struct.Struct:
    """(length, value) pairs for `count` elements of one fixed-width type."""
    return struct.Struct(">" + ("i" + code) * count)


def _fixed_width(element_oid: int, code: str, width: int, values: Sequence[Any]) -> BinaryArray:
    if None not in values:
        pairs = [width] * (2 * len(values))
        pairs[1::2] = values
        return _finish(element_oid, len(values), False, _fixed(code, len(values)).pack(*pairs))
    one = struct.Struct(f">i{code}")
    body = b"".join(_NULL if v is None else one.pack(width, v) for v in values)
    return _finish(element_oid, len(values), True, body)


def int4s(values: Sequence[int | None]) -> BinaryArray:
    return _fixed_width(_INT4, "i", 4, values)


def int8s(values: Sequence[int | None]) -> BinaryArray:
    return _fixed_width(_INT8, "q", 8, values)


def float8s(values: Sequence[float | None]) -> BinaryArray:
    return _fixed_width(_FLOAT8, "d", 8, values)


def timestamptzs(values: Sequence[datetime]) -> BinaryArray:
    """Aware datetimes (naive ones would be read as UTC); PostgreSQL's microseconds since 2000."""
    return _fixed_width(_TIMESTAMPTZ, "q", 8, [(v - _PG_EPOCH) // _MICROSECOND for v in values])


def _memoised(element_oid: int, values: Sequence[Any], encode: Any, key: Any = None) -> BinaryArray:  # noqa: ANN401
    """Each distinct value encoded once. `key` maps a value to what identifies it (default: the
    value; for uuids, the object's id: UUID's own hash and == run in Python)."""
    keys = values if key is None else list(map(key, values))
    count = len(values)
    if count and keys.count(keys[0]) == count:  # one value throughout (a batch's kinds, codes, token…)
        only = values[0]
        part = _NULL if only is None else _part(encode(only))
        return _finish(element_oid, count, only is None, part * count)
    seen: dict[Any, bytes] = {}
    parts = []
    has_null = False
    for k, value in zip(keys, values):  # noqa: B905 - the same length by construction
        part = seen.get(k)
        if part is None:
            if value is None:
                part, has_null = _NULL, True
            else:
                part = _part(encode(value))
            seen[k] = part
        parts.append(part)
    return _finish(element_oid, count, has_null, b"".join(parts))


def _part(raw: bytes) -> bytes:
    return _LENGTH.pack(len(raw)) + raw


def texts(values: Sequence[str | None]) -> BinaryArray:
    return _memoised(_TEXT, values, str.encode)


def uuids(values: Sequence[uuid.UUID | None]) -> BinaryArray:
    return _memoised(_UUID, values, lambda u: u.bytes, key=id)


class _AsIs(Dumper):
    """Sends an encoded array's bytes unchanged; one subclass per array type carries its OID."""

    format = Format.BINARY

    def dump(self, obj: bytes) -> bytes:
        return obj


_DUMPERS = [(cls, type(f"{cls.__name__}Dumper", (_AsIs,), {"oid": cls.oid})) for cls in _CLASSES.values()]


def register(adapters: Any) -> None:  # noqa: ANN401 - a psycopg AdaptersMap (connection.adapters)
    """Send BinaryArray parameters as they are, in binary, typed as their array (placeholders `%b`)."""
    for cls, dumper in _DUMPERS:
        adapters.register_dumper(cls, dumper)
