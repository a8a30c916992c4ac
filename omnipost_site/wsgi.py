"""WSGI entry point: the Procfile's `web` process (granian's WSGI interface), gunicorn gthread. The
ASGI one (omnipost_site.asgi: the Procfile's `stream` process, `make run`) runs this same application
in threads (a2wsgi) for every request but the live inbox stream and receipts (docs/DECISIONS.md "Serving").
Under granian, stop signals are relayed to the worker's main thread (omnipost_site.signal_relay).
"""

import sys

from omnipost_site.wsgi_app import build

application = build()

if "granian" in sys.modules:  # imported by a granian WSGI worker: its stop must reach the main thread
    from omnipost_site import signal_relay

    signal_relay.install()
