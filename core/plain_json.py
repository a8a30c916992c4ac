"""JSON text by orjson, for plain values only: where it writes what DRF's renderer and Django's
JSON encoders write (`json.dumps` with compact separators and UTF-8), about four times faster.

Plain: dicts with string keys, lists, strings, integers within 64 bits, floats, booleans, None,
UUIDs (written as `str(uuid)`, as the encoders do). Anything orjson would write differently
(datetimes, Decimals, str subclasses such as DRF's `ErrorDetail` or Django's TextChoices, lazy
translations, non-string keys, integers beyond 64 bits) is not plain: the caller uses its encoder.
Two differences remain, neither in a value: a float with an exponent is written 1e16 where
`json.dumps` writes 1e+16, and NaN or an infinity would be null where a strict encoder raises; the
API's parser refuses both in input. U+2028 and U+2029 are escaped, as DRF escapes them.
Used by the API's renderer (core.api.renderers), for JSON columns (notifications.services) and to
measure the API's JSON fields (notifications.validation).
"""

from __future__ import annotations

from typing import Any

import orjson

_PLAIN = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS


def _not_plain(value: Any) -> Any:  # noqa: ANN401
    raise TypeError(type(value).__name__)


def plain_size(data: Any) -> int | None:  # noqa: ANN401
    """The length of `data` as compact UTF-8 JSON (`json.dumps(data, separators=(",", ":"),
    ensure_ascii=False)`, encoded), or None when it holds a value that is not plain. A float
    with an exponent counts one byte fewer (1e16, not 1e+16)."""
    try:
        return len(orjson.dumps(data, option=_PLAIN, default=_not_plain))
    except (orjson.JSONEncodeError, TypeError):
        return None


def plain_json(data: Any) -> bytes | None:  # noqa: ANN401
    """`data` as compact UTF-8 JSON, or None when it holds a value that is not plain."""
    try:
        content = orjson.dumps(data, option=_PLAIN, default=_not_plain)
    except (orjson.JSONEncodeError, TypeError):
        return None
    if b"\xe2\x80\xa8" in content or b"\xe2\x80\xa9" in content:
        content = content.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
    return content
