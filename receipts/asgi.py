"""`POST /hooks/providers/{id}` under an ASGI server, before Django's ASGI handler.

The same requests as receipts.wsgi takes (a POST to that path with OMNIPOST_PUBLIC_URL set), the
same answers, computed by the same function (`receipts.wsgi.answer`, which calls
`receipts.views.receive`): the event loop reads the body (refusing more than MAX_BODY_BYTES with
`413` as soon as the Content-Length or the bytes read say so), hands the request to a pool of
OMNIPOST_RECEIPTS_THREADS threads, where the signature is checked and the receipts applied (one
database connection per thread; concurrent requests share apply statements, receipts.grouping),
and writes the answer.
Everything else, and every request while OMNIPOST_PUBLIC_URL is unset, goes to Django.

Why an ASGI path at all: a vendor posts at its traffic's rate, one small request each, and under
gunicorn the server's own work per request is most of the cost. Measured on this project's 2-core
machine (an app that only answers, 8 keep-alive clients, 2 workers): gunicorn's gthread worker
spends ≈ 135 µs of CPU a request, its asgi worker (uvloop, its C parser) ≈ 40 µs.

The lifespan protocol is answered here (Django's handler takes HTTP only); at shutdown the pool
finishes the requests it holds before the worker exits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings

from receipts.views import MAX_BODY_BYTES, TOO_LARGE, Answer
from receipts.wsgi import PATH, answer, encoded

# The pool's size is OMNIPOST_RECEIPTS_THREADS (default 2). Two beat four on a 2-core machine
# (docs/PERFORMANCE.md): one thread runs a statement while the other verifies the next request, and
# fewer threads contend less for the GIL.

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ReceiptsFastPathASGI:
    def __init__(self, app: ASGIApp, *, threads: int | None = None) -> None:
        self.app = app
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def pool(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is not None:  # every request after the first: no lock
            return pool
        with self._pool_lock:  # made in the serving process (after a pre-fork server's fork)
            if self._pool is None:
                size = self.threads or settings.OMNIPOST_RECEIPTS_THREADS
                self._pool = ThreadPoolExecutor(size, thread_name_prefix="receipts")
            return self._pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        match = PATH.fullmatch(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "POST" or not settings.OMNIPOST_PUBLIC_URL:
            await self.app(scope, receive, send)
            return
        environ = _environ(scope)
        try:
            body = await _body(environ, receive)
        except _HungUp:  # before its body was whole: nothing to verify, nobody to answer
            return
        if body is None:
            status, content, headers = TOO_LARGE
        else:
            environ["wsgi.input"] = _Body(body)
            loop = asyncio.get_running_loop()
            status, content, headers = await loop.run_in_executor(self.pool(), answer, int(match[1]), environ)
        await _respond(send, (status, content, headers))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                pool, self._pool = self._pool, None
                if pool is not None:
                    await asyncio.get_running_loop().run_in_executor(None, pool.shutdown)
                await send({"type": "lifespan.shutdown.complete"})
                return


def _environ(scope: Scope) -> dict[str, Any]:
    """The WSGI environ keys receipts.wsgi reads: path, query, content type and length, HTTP_* headers."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "PATH_INFO": scope["path"],
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
    }  # fmt: skip
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        value = raw_value.decode("latin-1")
        key = name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + name
        environ[key] = f"{environ[key]},{value}" if key in environ else value  # repeated headers, as WSGI joins them
    return environ


class _HungUp(Exception):  # noqa: N818 - an event, not an error
    """The client disconnected before its body was whole."""


async def _body(environ: dict[str, Any], receive: Receive) -> bytes | None:
    """The request's body, or None when it is (or says it will be) over MAX_BODY_BYTES; _HungUp
    when the client disconnects first."""
    try:
        declared = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > MAX_BODY_BYTES:
        return None
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _HungUp
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


class _Body:
    """`wsgi.input` over bytes already read (receipts.wsgi reads it once, up to a limit)."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, size: int = -1) -> bytes:
        data, self._data = (self._data, b"") if size < 0 else (self._data[:size], self._data[size:])
        return data


async def _respond(send: Send, answer_: Answer) -> None:
    status, content, headers = encoded(answer_)
    await send({"type": "http.response.start", "status": status,
                "headers": [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]})
    await send({"type": "http.response.body", "body": content})
