"""Cursor pagination of every API list: newest first, and bad input a 400."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request


class CreatedCursorPagination(CursorPagination):
    """Newest first; stable under concurrent inserts (no offsets)."""

    ordering = ("-created_at", "-pk")
    page_size_query_param = "limit"
    max_page_size = 500


class StrictCursorPagination(CreatedCursorPagination):
    """Cursor pagination whose bad input is a 400, not a silent default or a 404."""

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError({self.page_size_query_param: [f"must be an integer from 1 to {self.max_page_size}"]})
        return int(raw)

    def decode_cursor(self, request: Request) -> Any:
        try:
            return super().decode_cursor(request)
        except Exception:  # noqa: BLE001 - DRF raises NotFound; any undecodable cursor is the client's error
            message = "invalid cursor: pass back the `next` or `previous` link as given"
            raise ValidationError({self.cursor_query_param: [message]}) from None

    def get_schema_operation_parameters(self, view: Any) -> list[dict]:
        params = super().get_schema_operation_parameters(view)
        for param in params:
            if param["name"] == self.page_size_query_param:
                param["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_page_size}
        return params
