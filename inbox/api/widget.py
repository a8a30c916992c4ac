"""`GET /inbox/v1/widget.js`: the `<omnipost-inbox>` web component (inbox/static/inbox/widget.js), served
by OmniPost itself so a tenant's page needs one script tag and no build step. Read once per process."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from django.http import HttpRequest, HttpResponse, HttpResponseNotModified

SOURCE = Path(__file__).resolve().parent.parent / "static" / "inbox" / "widget.js"


@cache
def _script() -> tuple[bytes, str]:
    content = SOURCE.read_bytes()
    return content, '"' + hashlib.sha256(content).hexdigest()[:16] + '"'


def widget_js(request: HttpRequest) -> HttpResponse:
    content, etag = _script()
    if request.headers.get("If-None-Match") == etag:
        response: HttpResponse = HttpResponseNotModified()
    else:
        response = HttpResponse(content, content_type="text/javascript; charset=utf-8")
    response["ETag"] = etag
    response["Cache-Control"] = "public, max-age=300"
    # no CORS grant: a <script> tag on the tenant's page needs none, and /inbox/v1/ grants no origin
    # outside the tenants' lists
    return response
