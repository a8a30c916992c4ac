"""ASGI entry point: the Procfile's `stream` process and `make run`'s web process (granian's ASGI
interface), also served by gunicorn's asgi worker or uvicorn.

- `GET /inbox/v1/stream`, the in-app inbox's live stream, is answered on the event loop (inbox.live):
  open streams are tasks, thousands a process.
- Vendors' receipts (`POST /hooks/providers/{id}`) are read on the event loop and answered in their
  own threads (receipts.asgi).
- Everything else (the API, the console, the admin) is the WSGI application (omnipost_site.wsgi_app)
  run in a pool of OMNIPOST_WEB_THREADS threads a process (omnipost_site.wsgi_bridge), as granian's
  WSGI interface runs it in its blocking threads; not Django's ASGI handler, which runs sync views
  one at a time a process (docs/DECISIONS.md "Serving").
"""

from omnipost_site.wsgi_app import build
from omnipost_site.wsgi_bridge import WSGIInThreads

application = WSGIInThreads(build())

from inbox.live import InboxStreamASGI  # noqa: E402 - needs the app registry build() set up
from receipts.asgi import ReceiptsFastPathASGI  # noqa: E402

application = InboxStreamASGI(ReceiptsFastPathASGI(application))
