"""DRF's JSON renderer, with the same bytes written by orjson where orjson writes them alike.

DRF's `JSONRenderer` (compact separators, UTF-8, U+2028/U+2029 escaped, this project's settings)
runs `json.dumps` with its encoder: for a 1,000-notification batch response that was ≈ 15 % of the
request's Python. Plain values (core.plain_json) are written by orjson; anything else, and an
indented rendering asked for by the media type, by DRF's renderer as before.
"""

from __future__ import annotations

from typing import Any

from rest_framework import renderers

from core.plain_json import plain_json


class JSONRenderer(renderers.JSONRenderer):
    """The API's renderer (REST_FRAMEWORK's DEFAULT_RENDERER_CLASSES): see the module docstring."""

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:  # noqa: ANN401
        if data is not None and self.compact and not self.ensure_ascii and self.strict:
            if self.get_indent(accepted_media_type, renderer_context or {}) is None:
                content = plain_json(data)
                if content is not None:
                    return content
        return super().render(data, accepted_media_type, renderer_context)
