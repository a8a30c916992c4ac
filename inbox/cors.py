"""CORS for /inbox/v1/: a browser page on an origin the tenant allows (`inbox_allowed_origins`) may call
the subscriber's API with an inbox token; no other origin is granted anything.

A preflight carries no token, so it is answered for an origin that some tenant allows; the request
itself is granted only when its token's tenant allows the origin. Credentials (cookies) are never
allowed: the token travels in the Authorization header."""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import urlsplit

from django.http import HttpRequest, HttpResponse

from inbox import statements

PREFIX = "/inbox/v1/"
MAX_ORIGINS = 100
_HOST = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$|^\[[0-9a-f:.]+\]$")
ALLOW_HEADERS = "Authorization, Content-Type, Last-Event-ID"
ALLOW_METHODS = "GET, POST, PATCH, OPTIONS"
MAX_AGE = "600"


def check_origin(value: object) -> str:
    """An origin as browsers send it: `scheme://host[:port]`, http or https, nothing after it. Returns it
    lower-cased (the form compared with the `Origin` header)."""
    if not isinstance(value, str) or not value or len(value) > 300:
        raise ValueError("must be an origin such as https://app.example.com")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ValueError(f"{value!r} is not an origin: scheme://host[:port]") from None
    host = (parts.hostname or "").lower()
    bad_host = not host or not _HOST.match(host if ":" not in host else f"[{host}]")
    extra = parts.path or parts.query or parts.fragment or parts.username or parts.password or "@" in value
    if parts.scheme not in ("http", "https") or bad_host or extra:
        raise ValueError(f"{value!r} is not an origin: http(s)://host[:port], with no path, query or user")
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown}" + (f":{port}" if port is not None else "")


def check_origins(value: object) -> list[str]:
    if not isinstance(value, list):
        raise ValueError("must be a list of origins")
    if len(value) > MAX_ORIGINS:
        raise ValueError(f"at most {MAX_ORIGINS} origins")
    seen: list[str] = []
    for origin in value:
        checked = check_origin(origin)
        if checked not in seen:
            seen.append(checked)
    return seen


class InboxCorsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(PREFIX):
            return self.get_response(request)
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and origin and "Access-Control-Request-Method" in request.headers:
            return self._preflight(origin)
        response = self.get_response(request)
        if origin:
            patch_vary(response)
            subscriber = getattr(request, "inbox_subscriber", None)
            if subscriber is not None and origin in statements.allowed_origins(subscriber.tenant_id):
                response["Access-Control-Allow-Origin"] = origin
        return response

    @staticmethod
    def _preflight(origin: str) -> HttpResponse:
        response = HttpResponse(status=204)
        patch_vary(response)
        if statements.origin_allowed_anywhere(origin):
            response["Access-Control-Allow-Origin"] = origin
            response["Access-Control-Allow-Methods"] = ALLOW_METHODS
            response["Access-Control-Allow-Headers"] = ALLOW_HEADERS
            response["Access-Control-Max-Age"] = MAX_AGE
        return response


def patch_vary(response: HttpResponse) -> None:
    vary = response.get("Vary")
    if not vary:
        response["Vary"] = "Origin"
    elif "origin" not in vary.lower():
        response["Vary"] = f"{vary}, Origin"
