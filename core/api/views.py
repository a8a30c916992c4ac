"""JSON error pages for the API: unknown paths under /api/ and, with DEBUG off, 404/500 handlers."""

from __future__ import annotations

import sys

from django.http import HttpRequest, HttpResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt

from core.db_faults import is_connection_lost
from core.middleware import error_response, unavailable_response


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


@csrf_exempt  # a POST to a wrong path must be a JSON 404, not the CSRF failure page
def api_not_found(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
    """Catch-all after every API route, so a wrong path is a JSON 404 even with DEBUG on."""
    return error_response(404, "not_found", f"No API endpoint at {request.path}.")


def handler404(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return api_not_found(request)
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    # Called inside Django's `except` around the failing view or middleware (DEBUG off).
    exc = sys.exc_info()[1]
    if exc is not None and is_connection_lost(exc):
        return unavailable_response()
    if _is_api(request):
        return error_response(500, "server_error", "Internal server error; it has been logged.")
    return defaults.server_error(request)
