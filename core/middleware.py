"""Refuses request bodies over OMNIPOST_MAX_REQUEST_BYTES with 413 before anything reads them."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from core.db_faults import reset_connection


def error_response(status: int, code: str, message: str, details: dict | None = None) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, "details": details or {}}}, status=status)


# While no primary is reachable (a failover under way, PostgreSQL restarting) a request that needed
# the database is answered 503 with Retry-After, never 201: nothing it asked for was acknowledged.
UNAVAILABLE_CODE = "unavailable"
UNAVAILABLE_MESSAGE = (
    "The database is unavailable (a failover or restart may be under way); a write may or may not have "
    "been stored: retry, with the same Idempotency-Key, to get the stored result rather than a second one."
)
UNAVAILABLE_RETRY_AFTER = "1"


def unavailable_response() -> JsonResponse:
    reset_connection()  # the next request connects afresh, to whichever host is the primary by then
    response = error_response(503, UNAVAILABLE_CODE, UNAVAILABLE_MESSAGE)
    response["Retry-After"] = UNAVAILABLE_RETRY_AFTER
    return response


class RequestSizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        raw = request.META.get("CONTENT_LENGTH") or "0"
        try:
            length = int(raw)
        except ValueError:
            return error_response(400, "bad_request", "Content-Length is not a number.")
        limit = settings.OMNIPOST_LARGE_BODY_PATHS.get(request.path_info, settings.OMNIPOST_MAX_REQUEST_BYTES)
        if length > limit:
            return error_response(
                413,
                "request_too_large",
                f"Request body is {length} bytes; the limit is {limit} bytes.",
                {"limit_bytes": limit},
            )
        return self.get_response(request)
