"""Shared helpers of the inbox tests: a subscriber, an in_app notification (a real dispatcher run:
tests.queueing.dispatch_support.drain), the tenant's page with the widget on its own origin."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.pgserver import free_port


def subscriber(api, external_id: str = "jane", **fields: object) -> None:  # noqa: ANN001
    made = api.put(f"/api/v1/subscribers/{external_id}", fields, format="json")
    assert made.status_code in (200, 201), made.content


def notify(api, external_id: str = "jane", subject: str = "Hello", **fields: object) -> str:  # noqa: ANN001
    body = {"channel": "in_app", "subscriber": external_id, "subject": subject, "body": f"{subject}!", **fields}
    made = api.post("/api/v1/notifications", body, format="json")
    assert made.status_code == 201, made.content
    return made.json()["id"]


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Acme app</title>
<script src="{omnipost}/inbox/v1/widget.js"></script></head>
<body style="font-family:sans-serif;padding:24px">
<header style="display:flex;justify-content:space-between;align-items:center;width:600px">
<h1 style="margin:0">Acme</h1>
<omnipost-inbox base-url="{omnipost}" token="{token}"></omnipost-inbox>
</header></body></html>"""


@contextmanager
def tenant_app(html: str) -> Iterator[str]:
    """The tenant's own page on its own origin (another port on loopback)."""
    body = html.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="tenant-app", daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
