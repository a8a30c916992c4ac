"""DRF's JSON renderer, with the same bytes written by orjson where orjson writes them alike.

DRF's `JSONRenderer` (compact separators, UTF-8, U+2028/U+2029 escaped, this project's settings)
runs `json.dumps` with its encoder: for a 1,000-notification batch response that was ≈ 15 % of the
request's Python. orjson writes the same text for plain JSON values (dicts with string keys,
lists, strings, integers within 64 bits, floats, booleans, None, UUIDs) about four times faster.
Anything else goes to DRF's renderer as before: a value orjson would write differently (datetimes,
Decimals, str subclasses such as DRF's `ErrorDetail`, lazy translations, non-string keys, integers
beyond 64 bits), and an indented rendering asked for by the media type. Two differences remain,
neither in a value: a float with an exponent is written 1e16 where `json.dumps` writes 1e+16 (the
same number), and NaN or an infinity would be null where DRF raises; none reaches a response (the
parser refuses them in input, and no figure the API computes is one).
"""

from __future__ import annotations

from typing import Any

import orjson
from rest_framework import renderers

# UUIDs orjson writes as DRF's encoder does (str(uuid)); datetimes, str subclasses and dataclasses differ
_PLAIN = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS


def _not_plain(value: Any) -> Any:  # noqa: ANN401
    raise TypeError(type(value).__name__)


def plain_json(data: Any) -> bytes | None:  # noqa: ANN401
    """`data` as DRF's compact JSONRenderer writes it, or None when orjson would not write the same."""
    try:
        content = orjson.dumps(data, option=_PLAIN, default=_not_plain)
    except (orjson.JSONEncodeError, TypeError):
        return None
    if b"\xe2\x80\xa8" in content or b"\xe2\x80\xa9" in content:  # as DRF escapes them
        content = content.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
    return content


class JSONRenderer(renderers.JSONRenderer):
    """The API's renderer (REST_FRAMEWORK's DEFAULT_RENDERER_CLASSES): see the module docstring."""

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:  # noqa: ANN401
        if data is not None and self.compact and not self.ensure_ascii and self.strict:
            if self.get_indent(accepted_media_type, renderer_context or {}) is None:
                content = plain_json(data)
                if content is not None:
                    return content
        return super().render(data, accepted_media_type, renderer_context)
