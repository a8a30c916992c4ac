"""ASGI entry point: the Procfile's `stream` process and `make run`'s web process (granian's ASGI
interface), also served by gunicorn's asgi worker or uvicorn.

- `GET /inbox/v1/stream`, the in-app inbox's live stream, is answered on the event loop (inbox.live):
  open streams are tasks, thousands a process.
- Vendors' receipts (`POST /hooks/providers/{id}`) are read on the event loop and answered in their
  own threads (receipts.asgi).
- Everything else (the API, the console, the admin) is the WSGI application (omnipost_site.wsgi_app)
  under a2wsgi's WSGIMiddleware, in a pool of OMNIPOST_WEB_THREADS threads a process, as granian's
  WSGI interface runs it in its blocking threads; not Django's ASGI handler, which runs sync views
  one at a time a process (docs/DECISIONS.md "Serving").
"""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from a2wsgi import WSGIMiddleware
from django.conf import settings

from omnipost_site.wsgi_app import build

Message = MutableMapping[str, Any]
ASGIApp = Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


def receive_as_coroutine(app: ASGIApp) -> ASGIApp:
    """a2wsgi hands `receive()` to asyncio.run_coroutine_threadsafe, which takes coroutines only; the
    awaitable granian's `receive()` returns is not one."""

    async def application(scope: Message, receive: Callable[[], Awaitable[Message]], send: Any) -> None:  # noqa: ANN401
        async def coroutine() -> Message:
            return await receive()

        await app(scope, coroutine, send)

    return application


application = receive_as_coroutine(WSGIMiddleware(build(), workers=settings.OMNIPOST_WEB_THREADS))

from inbox.live import InboxStreamASGI  # noqa: E402 - needs the app registry build() set up
from receipts.asgi import ReceiptsFastPathASGI  # noqa: E402

application = InboxStreamASGI(ReceiptsFastPathASGI(application))
