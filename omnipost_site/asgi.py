"""ASGI entry point (gunicorn's asgi worker, uvicorn, granian's asgi interface). The Procfile serves
the WSGI one (omnipost_site.wsgi); this one is for an ASGI server, and is the faster way to take
vendors' receipts under gunicorn (receipts.asgi, docs/DECISIONS.md "Serving").

Vendors' receipts (POST /hooks/providers/{id}) skip Django's handler: see receipts.asgi. So does the
inbox's live stream (GET /inbox/v1/stream, inbox.live), which only an ASGI server can hold open by the
thousand.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")

application = get_asgi_application()

from receipts.asgi import ReceiptsFastPathASGI  # noqa: E402 - needs the app registry get_asgi_application set up

application = ReceiptsFastPathASGI(application)

from inbox.live import InboxStreamASGI  # noqa: E402

application = InboxStreamASGI(application)  # GET /inbox/v1/stream: Server-Sent Events on the event loop

from core import tracing  # noqa: E402

tracing.configure("web")  # with OTEL_EXPORTER_OTLP_ENDPOINT set: spans of creates and receipts
