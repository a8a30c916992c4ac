"""WSGI entry point, served by granian in the Procfile and `make run` (docs/DECISIONS.md "Serving"); gunicorn
gthread serves it as well. Under granian, stop signals are relayed to the worker's main thread
(omnipost_site.signal_relay).

With DEBUG on, static files (the admin's CSS and JavaScript) are served here, as `runserver` would:
`make run` serves through the production server, not runserver. Off, they are collected
(`collectstatic`) and served by whatever fronts the app.
"""

import os
import sys

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")

application = get_wsgi_application()

# Vendors' receipts (POST /hooks/providers/{id}) skip Django's handler: see receipts.wsgi.
from receipts.wsgi import ReceiptsFastPath  # noqa: E402 - needs the app registry get_wsgi_application set up

application = ReceiptsFastPath(application)

from core import tracing  # noqa: E402

tracing.configure("web")  # with OTEL_EXPORTER_OTLP_ENDPOINT set: spans of creates and receipts

if "granian" in sys.modules:  # imported by a granian worker: its stop must reach the main thread
    from omnipost_site import signal_relay

    signal_relay.install()

if settings.DEBUG and "django.contrib.staticfiles" in settings.INSTALLED_APPS:
    from django.contrib.staticfiles.handlers import StaticFilesHandler

    application = StaticFilesHandler(application)
