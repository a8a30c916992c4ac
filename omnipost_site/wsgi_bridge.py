"""The WSGI application under an ASGI server, each request answered in a pool of threads.

The ASGI application (omnipost_site.asgi) keeps the live inbox stream and vendors' receipts on the
event loop and hands every other request here: the API, the console and the admin run exactly as
under the WSGI server (the same application: omnipost_site.wsgi_app), `threads` requests at a time a
process (OMNIPOST_WEB_THREADS, as the WSGI server's blocking threads). Django's own ASGI handler
would run them one at a time a process (its sync views are thread_sensitive).

One hop to the pool a request: the event loop reads the body as Django under a WSGI server would (its
Content-Length's bytes; none over OMNIPOST_MAX_REQUEST_BYTES, which the application answers 413 from
the header; none when sent chunked, as docs/DECISIONS.md says), a thread runs the application and
collects its answer, the loop writes it. Answers are buffered, which every view of this project
allows (none streams; the stream is inbox.live's). a2wsgi's WSGIMiddleware, which streams both ways,
hops between the loop and the thread for every message instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import threading
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from a2wsgi.wsgi import build_environ
from django.conf import settings

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class WSGIInThreads:
    def __init__(self, app: WSGIApp, *, threads: int | None = None) -> None:
        self.app = app
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def pool(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is not None:
            return pool
        with self._pool_lock:  # made in the serving process, after a pre-fork server's fork
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads or settings.OMNIPOST_WEB_THREADS, thread_name_prefix="web")
            return self._pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":  # websockets are off (--no-ws); refuse one all the same
            await send({"type": "websocket.close", "code": 1000})
            return
        body = await _body(scope, receive)
        if body is None:  # the client left before its body was whole
            return
        environ = build_environ(scope, io.BytesIO(body))  # type: ignore[arg-type] - any file-like object
        context = contextvars.copy_context()
        status, headers, content = await asyncio.get_running_loop().run_in_executor(
            self.pool(), context.run, self._answer, environ
        )
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def _answer(self, environ: dict[str, Any]) -> Answer:
        started: list[Any] = []
        chunks: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:  # noqa: ANN401
            started[:] = [status, headers]  # nothing is sent before the application returns: a second call replaces
            return chunks.append

        iterable = self.app(environ, start_response)
        try:
            chunks.extend(iterable)
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()
        status, headers = started
        encoded = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]
        return int(status.split(" ", 1)[0]), encoded, b"".join(chunks)


async def _body(scope: Scope, receive: Receive) -> bytes | None:
    """The request's body as Django under a WSGI server reads it: none when its Content-Length is over
    OMNIPOST_MAX_REQUEST_BYTES (the application answers 413 from the header) or absent (a chunked body
    is read as empty: 400); None if the client left before it was whole."""
    limit = settings.OMNIPOST_MAX_REQUEST_BYTES
    length = next((value for name, value in scope.get("headers", ()) if name == b"content-length"), None)
    try:
        if length is None or not 0 < int(length) <= limit:
            return b""
    except ValueError:  # the application answers 400 from the header
        return b""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        part = message.get("body", b"")
        parts.append(part)
        size += len(part)
        if not message.get("more_body", False) or size > limit:
            return b"".join(parts)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
