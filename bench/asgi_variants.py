"""ASGI applications for `bench/ingest_bench.py --server granian-asgi --asgi-app NAME`: the project's
ASGI application (omnipost_site.asgi) with the WSGI application under another adapter, to measure
the adapters side by side. Each keeps the stream and receipts wrappers of omnipost_site.asgi.

- `django`: Django's own ASGI handler (sync views in `sync_to_async(thread_sensitive=True)`).

(`project` is omnipost_site.asgi itself: a2wsgi's WSGIMiddleware.)
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")


def _django():  # noqa: ANN202
    from django.core.asgi import get_asgi_application

    application = get_asgi_application()

    from inbox.live import InboxStreamASGI  # after the app registry is ready
    from receipts.asgi import ReceiptsFastPathASGI

    return InboxStreamASGI(ReceiptsFastPathASGI(application))


application = {"django": _django}[os.environ.get("BENCH_ASGI_APP", "django")]()
