"""The WSGI application, built once a process: Django's handler behind the receipts fast path
(receipts.wsgi), tracing configured, and with DEBUG on the admin's static files served as
`runserver` would (`make run` serves through the production server; off, they are collected with
`collectstatic` and served by whatever fronts the app).

Served by granian's WSGI interface (omnipost_site.wsgi) or, in threads, by the ASGI application
(omnipost_site.asgi, under a2wsgi).
"""

import os
from collections.abc import Callable

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")


def build() -> Callable:
    from django.conf import settings
    from django.core.wsgi import get_wsgi_application

    application: Callable = get_wsgi_application()

    # Vendors' receipts (POST /hooks/providers/{id}) skip Django's handler: see receipts.wsgi.
    from core import tracing
    from receipts.wsgi import ReceiptsFastPath  # needs the app registry get_wsgi_application set up

    application = ReceiptsFastPath(application)
    tracing.configure("web")  # with OTEL_EXPORTER_OTLP_ENDPOINT set: spans of creates and receipts

    if settings.DEBUG and "django.contrib.staticfiles" in settings.INSTALLED_APPS:
        from django.contrib.staticfiles.handlers import StaticFilesHandler

        application = StaticFilesHandler(application)
    return application
