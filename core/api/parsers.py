"""A JSON parser that turns hostile input into clear 400s instead of 500s."""

from __future__ import annotations

import json
import math
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        # 1e999 parses to inf, which PostgreSQL's jsonb cannot store.
        raise ValueError(f"number {text[:20]} is out of range; JSON numbers must be finite")
    return value


def _check(value: Any, level: int = 0) -> None:
    """Depth limit, and no NUL in any string or key (PostgreSQL text cannot hold one)."""
    if level > MAX_DEPTH:
        raise ParseError(f"JSON is nested more than {MAX_DEPTH} levels deep.")
    if isinstance(value, str):
        if "\x00" in value:
            raise ParseError("Request body contains a NUL character (\\u0000).")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check(key, level)
            _check(item, level + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, level + 1)


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None) -> Any:  # noqa: ANN001
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"Request body is not valid UTF-8 (byte {exc.start}).") from None
        if "\x00" in text:
            raise ParseError("Request body contains a NUL character.")
        try:
            data = json.loads(text, parse_constant=_no_constants, parse_float=_finite_float) if text.strip() else {}
        except RecursionError:
            raise ParseError(f"JSON is nested more than {MAX_DEPTH} levels deep.") from None
        except ValueError as exc:
            # Also Python's limit on integer digits ("Exceeds the limit (4300 digits)…").
            raise ParseError(f"JSON parse error: {exc}") from None
        _check(data)
        return data
