"""The web process as `make run` (run_all's `web_server`) starts it, and the Procfile's `stream`
process (which the `web` process redirects browsers to), serve the live inbox stream and the
API on one port: a stream opened with a subscriber's token gets the item a real dispatcher delivers
while API calls on the same port are answered; SIGTERM stops it with a stream still open (exit 0,
within granian's --workers-kill-timeout). The Procfile's `web` process (granian WSGI) serves the API
and sends a browser's stream to the `stream` process (a real chromium through both processes).
Request bodies reach the API through the ASGI server's WSGI adapter (a2wsgi) as under the
WSGI server: over the limit 413, chunked read as empty (400)."""

from __future__ import annotations

import http.client
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from inbox.models import InboxItem
from omnipost_site.ops.management.commands.run_all import web_server
from tests.dlq.test_console_browser import chromium_page
from tests.inbox.stream_support import stream
from tests.inbox.support import PAGE, tenant_app
from tests.queueing.dispatch_support import drain
from tests.support.pgserver import free_port
from tests.support.web import serve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


def run_all_command(port: int) -> list[str]:
    return web_server(f"127.0.0.1:{port}", [sys.executable, str(ROOT / "manage.py")])


def procfile_command(port: int, process: str = "web") -> list[str]:
    """The Procfile's `process` line, on loopback and `port`, its `granian` run by this interpreter."""
    [line] = [line for line in (ROOT / "Procfile").read_text().splitlines() if line.startswith(f"{process}:")]
    words = shlex.split(line.removeprefix(f"{process}:").replace("${PORT:-8000}", str(port))
                        .replace("${STREAM_PORT:-8001}", str(port)))  # fmt: skip
    words[words.index("--host") + 1] = "127.0.0.1"
    assert words[0] == "granian"
    return [sys.executable, "-m", "granian", *words[1:]]


def procfile_stream_command(port: int) -> list[str]:
    return procfile_command(port, "stream")


@contextmanager
def started(command: list[str], env: dict[str, str], port: int) -> Iterator[tuple[str, subprocess.Popen]]:
    with serve(command, {**env, "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS": "true"}, port) as web:  # as run_all's
        yield web.url, web.process


@pytest.mark.parametrize("command", [run_all_command, procfile_stream_command], ids=["run_all", "Procfile-stream"])
def test_the_web_process_serves_the_stream_and_the_api_on_one_port(command, subprocess_env, key_a, tmp_path):
    port = free_port()
    with started(command(port), subprocess_env, port) as (url, proc):
        api = httpx.Client(base_url=f"{url}/api/v1/", headers={"Authorization": f"Bearer {key_a}"}, timeout=20)
        assert api.put("subscribers/jane", json={}).status_code in (200, 201)
        made = api.post("subscribers/jane/inbox-token", json={"ttl_seconds": 600})
        assert made.status_code == 201, made.text
        with stream(url, made.json()["token"]) as live:
            assert live.status == 200 and live.headers["content-type"].startswith("text/event-stream")
            assert live.next().kind == "counts"
            # The API on the same port while the stream is open: a create, a read, a list.
            created = api.post("notifications", json={"channel": "in_app", "subscriber": "jane",
                                                      "subject": "Shipped", "body": "On its way"})  # fmt: skip
            assert created.status_code == 201, created.text
            notification_id = created.json()["id"]
            assert api.get(f"notifications/{notification_id}").json()["id"] == notification_id
            assert api.get("notifications", params={"limit": 5}).status_code == 200
            drain(subprocess_env, tmp_path / "dispatcher", until=lambda: InboxItem.objects.exists())
            assert live.next_of("item").notification_id == notification_id
            # A stop with the stream still open: the worker ends it by --workers-kill-timeout at the latest.
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            left = [live.next(timeout=5) for _ in range(3)]  # what it had sent (counts), then its end
            assert left[-1] is None, left


def test_the_procfiles_web_process_without_a_stream_url_answers_the_stream_404(subprocess_env, key_a):
    port = free_port()
    with started(procfile_command(port), subprocess_env, port) as (url, proc):
        api = httpx.Client(base_url=f"{url}/api/v1/", headers={"Authorization": f"Bearer {key_a}"}, timeout=20)
        assert api.put("subscribers/jane", json={}).status_code in (200, 201)
        token = api.post("subscribers/jane/inbox-token", json={"ttl_seconds": 600}).json()["token"]
        with stream(url, token) as live:
            assert live.status == 404  # OMNIPOST_STREAM_URL unset: nowhere to send it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


@pytest.mark.browser
def test_a_browser_reaches_the_stream_through_the_procfiles_web_process(subprocess_env, key_a, tmp_path):
    """The Procfile's two processes as they are written, no proxy: the widget on another origin, its
    base-url the `web` process, gets its stream from the `stream` process through the web's redirect
    (the browser's `Origin: null` after it granted from `redirected_from`), and a delivered item live."""
    stream_port, web_port = free_port(), free_port()
    with (
        started(procfile_stream_command(stream_port), subprocess_env, stream_port) as (stream_url, _),
        started(procfile_command(web_port), {**subprocess_env, "OMNIPOST_STREAM_URL": stream_url}, web_port) as web,
    ):
        url = web[0]
        api = httpx.Client(base_url=f"{url}/api/v1/", headers={"Authorization": f"Bearer {key_a}"}, timeout=20)
        assert api.put("subscribers/jane", json={}).status_code in (200, 201)
        token = api.post("subscribers/jane/inbox-token", json={"ttl_seconds": 600}).json()["token"]
        bad = httpx.get(f"{url}/inbox/v1/stream", params={"token": token + "x"}, timeout=20)
        assert bad.status_code == 401  # checked before it is sent anywhere
        with tenant_app(PAGE.format(omnipost=url, token=token)) as app_origin:
            assert api.patch("settings", json={"inbox_allowed_origins": [app_origin]}).status_code == 200
            sent = httpx.get(f"{url}/inbox/v1/stream", params={"token": token}, headers={"Origin": app_origin})
            assert sent.status_code == 307 and sent.headers["access-control-allow-origin"] == app_origin
            assert sent.headers["location"].startswith(f"{stream_url}/inbox/v1/stream?token=")
            with stream(stream_url, None, origin="null", path=sent.headers["location"].removeprefix(stream_url)) as s:
                assert s.headers["access-control-allow-origin"] == "null"  # from an origin the tenant allows
            with stream(stream_url, token, origin="null") as s:  # no redirected_from: no grant
                assert s.status == 200 and "access-control-allow-origin" not in s.headers

            with chromium_page(900, 640) as page:
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.goto(app_origin)
                widget = page.locator("omnipost-inbox")
                widget.locator(".bell").click()
                widget.get_by_text("Nothing yet").wait_for()  # the stream is open (its first event came)
                shipped = {"channel": "in_app", "subscriber": "jane", "subject": "Your order shipped", "body": "Soon"}
                made = api.post("notifications", json=shipped)
                assert made.status_code == 201, made.text
                drain(subprocess_env, tmp_path / "dispatcher", until=lambda: InboxItem.objects.exists())
                widget.locator("li[data-id]", has_text="Your order shipped").wait_for(timeout=60_000)
                assert widget.locator(".count").inner_text() == "1"
                assert not errors, errors


def test_request_bodies_are_read_as_under_the_wsgi_server(subprocess_env, key_a):
    port = free_port()
    env = {**subprocess_env, "OMNIPOST_MAX_REQUEST_BYTES": "2000"}
    with started(run_all_command(port), env, port) as (url, proc):
        headers = {"Authorization": f"Bearer {key_a}", "Content-Type": "application/json"}
        big = b'{"channel": "email", "recipient": "jane@example.com", "body": "' + b"x" * 5000 + b'"}'
        sized = httpx.post(f"{url}/api/v1/notifications", content=big, headers=headers, timeout=20)
        assert sized.status_code == 413, sized.text

        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)  # chunked: no Content-Length
        conn.request("POST", "/api/v1/notifications", body=iter([big[:3000], big[3000:]]), headers=headers,
                     encode_chunked=True)  # fmt: skip
        chunked = conn.getresponse()  # read as empty, as Django under a WSGI server reads it
        assert chunked.status == 400, chunked.read()
        conn.close()

        small = httpx.post(f"{url}/api/v1/notifications", headers=headers, timeout=20,
                           json={"channel": "email", "recipient": "jane@example.com", "body": "hi"})  # fmt: skip
        # Read whole and validated: the tenant has no email provider (an empty body would fail on its fields).
        assert small.status_code == 400 and list(small.json()["error"]["details"]) == ["provider"], small.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
