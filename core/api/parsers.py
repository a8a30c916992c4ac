"""A JSON parser that turns hostile input into clear 400s instead of 500s."""

from __future__ import annotations

import json
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


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
            data = json.loads(text, parse_constant=_no_constants) if text.strip() else {}
        except RecursionError:
            raise ParseError(f"JSON is nested more than {MAX_DEPTH} levels deep.") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error: {exc}") from None
        if _depth(data) > MAX_DEPTH:
            raise ParseError(f"JSON is nested more than {MAX_DEPTH} levels deep.")
        return data
