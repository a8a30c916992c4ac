"""omnipost_site.wsgi_bridge in process: requests run at once in `threads` threads (not one at a time as
in Django's ASGI handler), bodies reach the application as a WSGI server hands them over, answers are
written whole."""

from __future__ import annotations

import asyncio
import threading

import pytest

from omnipost_site.wsgi_bridge import WSGIInThreads

pytestmark = pytest.mark.timeout(60)


def _scope(method: str = "GET", path: str = "/x", headers: list[tuple[bytes, bytes]] | None = None) -> dict:
    return {"type": "http", "method": method, "path": path, "query_string": b"", "http_version": "1.1",
            "headers": headers or [], "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000)}  # fmt: skip


async def _call(app, scope: dict, messages: list[dict]) -> list[dict]:  # noqa: ANN001
    pending = list(messages)
    sent: list[dict] = []

    async def receive() -> dict:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_requests_run_at_once_in_the_pools_threads():
    barrier = threading.Barrier(4, timeout=10)  # broken (an error) unless 4 requests run at the same time
    names: list[str] = []

    def app(environ, start_response):  # noqa: ANN001, ANN202
        names.append(threading.current_thread().name)
        barrier.wait()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    bridge = WSGIInThreads(app, threads=4)

    async def main() -> list[list[dict]]:
        return await asyncio.gather(*(_call(bridge, _scope(), [{"type": "http.request"}]) for _ in range(4)))

    answers = asyncio.run(main())
    bridge.pool().shutdown()
    assert [[m.get("status") or m.get("body") for m in sent] for sent in answers] == [[200, b"ok"]] * 4
    assert len(set(names)) == 4 and all(name.startswith("web") for name in names)


def test_bodies_reach_the_application_as_a_wsgi_server_gives_them(settings):
    settings.OMNIPOST_MAX_REQUEST_BYTES = 100
    seen: list[tuple[str | None, bytes]] = []

    def app(environ, start_response):  # noqa: ANN001, ANN202
        length = environ.get("CONTENT_LENGTH")
        seen.append((length, environ["wsgi.input"].read(int(length or 0))))
        start_response("201 Created", [("X-Answer", "yes")])
        return iter([b"a", b"b"])

    bridge = WSGIInThreads(app, threads=1)
    pieces = [{"type": "http.request", "body": b"hello ", "more_body": True},
              {"type": "http.request", "body": b"world", "more_body": False}]  # fmt: skip
    sized = asyncio.run(_call(bridge, _scope("POST", headers=[(b"content-length", b"11")]), pieces))
    assert sized == [{"type": "http.response.start", "status": 201, "headers": [(b"x-answer", b"yes")]},
                     {"type": "http.response.body", "body": b"ab"}]  # fmt: skip
    over = asyncio.run(_call(bridge, _scope("POST", headers=[(b"content-length", b"101")]), pieces))
    chunked = asyncio.run(_call(bridge, _scope("POST", headers=[(b"transfer-encoding", b"chunked")]), pieces))
    assert over[0]["status"] == chunked[0]["status"] == 201
    # Over the limit: not read (the application refuses it from the header); chunked: read as empty.
    assert seen == [("11", b"hello world"), ("101", b""), (None, b"")]


def test_a_client_that_leaves_before_its_body_is_whole_is_not_answered():
    called: list[bool] = []

    def app(environ, start_response):  # noqa: ANN001, ANN202
        called.append(True)
        start_response("200 OK", [])
        return [b""]

    bridge = WSGIInThreads(app, threads=1)
    sent = asyncio.run(_call(bridge, _scope("POST", headers=[(b"content-length", b"10")]),
                             [{"type": "http.request", "body": b"12345", "more_body": True}]))  # fmt: skip
    assert sent == [] and called == []
