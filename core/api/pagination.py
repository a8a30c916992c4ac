from __future__ import annotations

from rest_framework.pagination import CursorPagination


class CreatedCursorPagination(CursorPagination):
    """Newest first; stable under concurrent inserts (no offsets)."""

    ordering = ("-created_at", "-pk")
    page_size_query_param = "limit"
    max_page_size = 500
