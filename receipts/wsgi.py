"""`POST /hooks/providers/{id}` answered before Django's request handling (a WSGI wrapper).

Vendors post receipts at their traffic's rate, one small signed request each, and the endpoint
needs nothing of what Django's handler and middleware do for the API and the console (sessions,
users, messages, CSRF, clickjacking headers, URL resolution): it is authenticated by the vendor's
signature, builds its URL from OMNIPOST_PUBLIC_URL and answers JSON. So the wrapper in
`omnipost_site.wsgi` sends those requests straight to `receipts.views.receive` — the same function
the Django view calls, with the same size limit and answers — and everything else to Django.
Around each one it does what Django's request_started / request_finished receivers do for a
request that uses only the database (`_begin` / `_end`: queries log reset, connection age and errors,
core.conn_checks' health rule) without the signal dispatch and the cache and URLconf resets this
path has no use for (together ≈ 50 µs of a ≈ 350 µs request). Headers are read from the environ
on demand (`EnvironHeaders`) rather than all parsed into Django's HttpHeaders. Without
OMNIPOST_PUBLIC_URL (development) the Django view answers, as it builds the URL from the Host
header, which only Django validates (ALLOWED_HOSTS).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson
from django.conf import settings
from django.db import connections
from django.utils.encoding import iri_to_uri

from core import conn_checks
from core.db_faults import is_connection_lost, reset_connection
from core.middleware import UNAVAILABLE_CODE, UNAVAILABLE_MESSAGE, UNAVAILABLE_RETRY_AFTER
from receipts.inbound import InboundRequest
from receipts.views import MAX_BODY_BYTES, TOO_LARGE, Answer, error_answer, form_of, receive

logger = logging.getLogger("omnipost.receipts")

PATH = re.compile(r"/hooks/providers/([0-9]{1,18})")
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 413: "Request Entity Too Large",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class ReceiptsFastPath:
    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        match = PATH.fullmatch(environ.get("PATH_INFO", ""))
        if match is None or environ.get("REQUEST_METHOD") != "POST" or not settings.OMNIPOST_PUBLIC_URL:
            return self.app(environ, start_response)
        status, content, headers = encoded(answer(int(match[1]), environ))
        start_response(f"{status} {_REASONS.get(status, '')}".rstrip(), headers)
        return [content]


def encoded(answer_: Answer) -> tuple[int, bytes, list[tuple[str, str]]]:
    """An answer as it goes on the wire (this module's and receipts.asgi's): status, JSON body, headers."""
    status, body, headers = answer_
    content = orjson.dumps(body)
    return status, content, [("Content-Type", "application/json"), ("Content-Length", str(len(content))),
                             *headers.items()]  # fmt: skip


def answer(provider_id: int, environ: dict[str, Any]) -> Answer:
    """The answer to one receipts request, in the thread that calls it (it may use the database)."""
    _begin()
    try:
        return _answer(provider_id, environ)
    finally:
        _end()


def _begin() -> None:
    conns = connections.all(initialized_only=True)  # listed once: each listing reads asgiref Locals
    for conn in conns:  # django.db.reset_queries, close_old_connections
        conn.queries_log.clear()
        conn.close_if_unusable_or_obsolete()
    conn_checks.started(conns)


def _end() -> None:
    conns = connections.all(initialized_only=True)
    for conn in conns:  # django.db.close_old_connections
        conn.close_if_unusable_or_obsolete()
    conn_checks.finished(conns)


class EnvironHeaders(Mapping[str, str]):
    """A request's headers, case-insensitive, read from the WSGI environ when asked (as HttpHeaders names them)."""

    __slots__ = ("_environ",)
    _UNPREFIXED = ("CONTENT_TYPE", "CONTENT_LENGTH")

    def __init__(self, environ: Mapping[str, Any]) -> None:
        self._environ = environ

    @classmethod
    def _key(cls, name: str) -> str:
        key = name.upper().replace("-", "_")
        return key if key in cls._UNPREFIXED else "HTTP_" + key

    def __getitem__(self, name: str) -> str:
        return self._environ[self._key(name)]

    def get(self, name: str, default: Any = None) -> Any:  # noqa: ANN401 - Mapping.get's own signature
        return self._environ.get(self._key(name), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) in self._environ

    def _names(self) -> Iterator[str]:
        for key in self._environ:
            if key.startswith("HTTP_"):
                yield key[5:].replace("_", "-").title()
            elif key in self._UNPREFIXED:
                yield key.replace("_", "-").title()

    def __iter__(self) -> Iterator[str]:
        return self._names()

    def __len__(self) -> int:
        return sum(1 for _ in self._names())


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
        inbound = InboundRequest(url=url, headers=EnvironHeaders(environ), body=body, form=form)
        return receive(provider_id, inbound)
    except Exception as exc:
        if is_connection_lost(exc):  # no primary reachable: the vendor retries on 503 as on 500
            logger.warning("receipts for provider %s: database unavailable (%s)", provider_id, type(exc).__name__)
            reset_connection()
            status, body, _ = error_answer(503, UNAVAILABLE_CODE, UNAVAILABLE_MESSAGE)
            return status, body, {"Retry-After": UNAVAILABLE_RETRY_AFTER}
        logger.exception("receipts for provider %s failed", provider_id)
        return error_answer(500, "server_error", "The receipts could not be stored; retry.")
