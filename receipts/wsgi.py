"""`POST /hooks/providers/{id}` answered before Django's request handling (a WSGI wrapper).

Vendors post receipts at their traffic's rate, one small signed request each, and the endpoint
needs nothing of what Django's handler and middleware do for the API and the console (sessions,
users, messages, CSRF, clickjacking headers, URL resolution): it is authenticated by the vendor's
signature, builds its URL from OMNIPOST_PUBLIC_URL and answers JSON. So the wrapper in
`omnipost_site.wsgi` sends those requests straight to `receipts.views.receive` — the same function
the Django view calls, with the same size limit and answers — and everything else to Django.
Django's request_started / request_finished signals still run around each one (database connection
age, health checks). Without OMNIPOST_PUBLIC_URL (development) the Django view answers, as it
builds the URL from the Host header, which only Django validates (ALLOWED_HOSTS).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from django.conf import settings
from django.core import signals
from django.http.request import HttpHeaders
from django.utils.encoding import iri_to_uri

from receipts.inbound import InboundRequest
from receipts.views import MAX_BODY_BYTES, TOO_LARGE, Answer, error_answer, form_of, receive

logger = logging.getLogger("omnipost.receipts")

_PATH = re.compile(r"/hooks/providers/([0-9]{1,18})")
_REASONS = {200: "OK", 401: "Unauthorized", 404: "Not Found", 413: "Request Entity Too Large",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class ReceiptsFastPath:
    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        match = _PATH.fullmatch(environ.get("PATH_INFO", ""))
        if match is None or environ.get("REQUEST_METHOD") != "POST" or not settings.OMNIPOST_PUBLIC_URL:
            return self.app(environ, start_response)
        signals.request_started.send(sender=self.__class__, environ=environ)
        try:
            status, body, headers = _answer(int(match[1]), environ)
        finally:
            signals.request_finished.send(sender=self.__class__)
        content = orjson.dumps(body)
        start_response(f"{status} {_REASONS.get(status, '')}".rstrip(), [
            ("Content-Type", "application/json"), ("Content-Length", str(len(content))), *headers.items(),
        ])  # fmt: skip
        return [content]


def _answer(provider_id: int, environ: dict[str, Any]) -> Answer:
    try:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY_BYTES:
            return TOO_LARGE
        body = environ["wsgi.input"].read(MAX_BODY_BYTES + 1) if length or "CONTENT_LENGTH" not in environ else b""
        if len(body) > MAX_BODY_BYTES:
            return TOO_LARGE
        query = environ.get("QUERY_STRING", "")
        url = settings.OMNIPOST_PUBLIC_URL + environ["PATH_INFO"] + (f"?{iri_to_uri(query)}" if query else "")
        form = form_of(environ.get("CONTENT_TYPE", ""), body)
        inbound = InboundRequest(url=url, headers=HttpHeaders(environ), body=body, form=form)
        return receive(provider_id, inbound)
    except Exception:
        logger.exception("receipts for provider %s failed", provider_id)
        return error_answer(500, "server_error", "The receipts could not be stored; retry.")
