"""Receipts under gunicorn's asgi worker (omnipost_site.asgi, receipts.asgi) answer exactly as under
its gthread worker (omnipost_site.wsgi, receipts.wsgi): the same requests, the same statuses and
bodies, the same rows stored; everything else reaches Django; sessions the database terminates are
reconnected, never a 500 or a lost receipt; SIGTERM stops the worker cleanly."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from django.db import connection

from notifications.models import Notification
from receipts import asgi as receipts_asgi
from receipts.asgi import _environ
from receipts.models import NotificationEvent, ReceiptDedup
from receipts.views import MAX_BODY_BYTES
from receipts.wsgi import EnvironHeaders
from tests import factories
from tests.receipts.conftest import signed
from tests.support import web

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SECRET = "whsec_" + "QUFB" * 8


def _requests(provider: int, other: int, notes: list[str], theirs: str) -> list[tuple[str, str, dict, bytes | None]]:
    """(name, path, headers, body): what a vendor (and a stranger) may send."""

    def event(note: str, kind: str, msg_id: str, secret: str = SECRET) -> tuple[dict, bytes]:
        body, headers = signed(secret, {"type": kind, "notification_id": note}, msg_id=msg_id)
        return {**headers, "Content-Type": "application/json"}, body

    path = f"/hooks/providers/{provider}"
    run = uuid.uuid4().hex  # each server gets its own vendor event ids
    delivered = event(notes[0], "delivered", f"msg_{run}_1")
    return [
        ("delivered", path, *delivered),
        ("the same again", path, *delivered),
        ("bounced", path, *event(notes[1], "bounced", f"msg_{run}_2")),
        ("bad signature", path, *event(notes[2], "delivered", f"msg_{run}_3", "whsec_" + "QkJC" * 8)),
        ("another provider's URL", f"/hooks/providers/{other}", *event(notes[2], "delivered", f"msg_{run}_4")),
        ("another tenant's notification", path, *event(theirs, "complained", f"msg_{run}_5")),
        ("no such provider", "/hooks/providers/999999999", *event(notes[2], "delivered", f"msg_{run}_6")),
    ]


def _answers(url: str, requests: list[tuple[str, str, dict, bytes | None]]) -> dict[str, tuple[int, object]]:
    out = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for name, path, headers, body in requests:
            response = client.post(path, content=body, headers=headers)
            out[name] = (response.status_code, response.json())
        _, path, headers, body = requests[2]  # sent again in pieces, with no Content-Length (chunked)
        response = client.post(path, content=(body[i : i + 7] for i in range(0, len(body), 7)), headers=headers)
        out["the bounce again, chunked"] = (response.status_code, response.json())
        response = client.get(requests[0][1])
        out["GET (Django's view)"] = (response.status_code, response.json())
        out["/healthz (Django)"] = (client.get("/healthz").status_code, None)
    out["over the size limit"] = _declared_too_large(url, requests[0][1])
    return out


def _declared_too_large(url: str, path: str) -> tuple[int, object]:
    """A Content-Length over the limit, on a connection of its own, the body never sent: the answer
    must come from the headers alone (reading a megabyte first, or waiting for it, fails this)."""
    connection_ = http.client.HTTPConnection(urlsplit(url).netloc, timeout=10)
    try:
        connection_.putrequest("POST", path)
        connection_.putheader("Content-Type", "application/json")
        connection_.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
        connection_.endheaders()
        response = connection_.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection_.close()


@pytest.fixture
def providers(tenant_a, tenant_b):  # noqa: ANN001, ANN201
    mine = factories.provider(tenant_a, "hook", secrets={"signing_secret": SECRET}, is_default=True)
    other = factories.provider(tenant_a, "hook2", secrets={"signing_secret": "whsec_" + "Q0ND" * 8})
    theirs = factories.provider(tenant_b, "hook", secrets={"signing_secret": SECRET})
    return mine, other, factories.notifications(tenant_b, theirs, 1, status="delivered")[0]


def test_the_asgi_worker_answers_receipts_as_the_wsgi_one_does(subprocess_env, tenant_a, providers):
    mine, other, theirs = providers
    answers, stored, codes = {}, {}, {}
    for name, app in (("gthread", web.GTHREAD), ("asgi", web.ASGI)):
        notes = [str(n.pk) for n in factories.notifications(tenant_a, mine, 3, status="delivered")]
        with web.gunicorn(subprocess_env, app) as served:
            answers[name] = _answers(served.url, _requests(mine.pk, other.pk, notes, str(theirs.pk)))
        codes[name] = served.process.returncode
        stored[name] = (
            sorted(NotificationEvent.objects.filter(notification_id__in=notes).values_list("type", flat=True)),
            sorted(r or "" for r in Notification.objects.filter(pk__in=notes).values_list("receipt", flat=True)),
        )
    assert answers["asgi"] == answers["gthread"]
    statuses = {name: status for name, (status, _) in answers["asgi"].items()}
    assert statuses == {
        "delivered": 200, "the same again": 200, "bounced": 200, "bad signature": 401,
        "another provider's URL": 401, "another tenant's notification": 200, "no such provider": 404,
        "over the size limit": 413, "the bounce again, chunked": 200, "GET (Django's view)": 405,
        "/healthz (Django)": 200,
    }  # fmt: skip
    assert stored["asgi"] == stored["gthread"] == (["bounced", "delivered"], ["", "bounced", "delivered"])
    assert NotificationEvent.objects.filter(notification=theirs).count() == 0
    assert codes == {"gthread": 0, "asgi": 0}, "SIGTERM stops either worker cleanly"


def _terminate(app_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()",
            [app_name],
        )
        return cursor.fetchone()[0]


@pytest.fixture
def asgi_server(subprocess_env) -> Iterator[tuple[str, str]]:  # noqa: ANN001
    app_name = f"receipts-asgi-{uuid.uuid4().hex[:8]}"
    env = {**subprocess_env, "OMNIPOST_APP_NAME": app_name, "CONN_MAX_AGE": "600"}  # sessions kept between requests
    with web.gunicorn(env, web.ASGI) as served:
        yield served.url, app_name


def test_terminated_sessions_are_reconnected_and_no_receipt_is_lost(asgi_server, tenant_a, providers):
    url, app_name = asgi_server
    mine = providers[0]
    notes = [str(n.pk) for n in factories.notifications(tenant_a, mine, 12, status="delivered")]
    statuses: list[int] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for round_ in range(3):
            for i, note in enumerate(notes[round_ * 4 : (round_ + 1) * 4]):
                body, headers = signed(SECRET, {"type": "delivered", "notification_id": note}, msg_id=f"m{round_}{i}")
                for _attempt in range(5):  # as a vendor retries a 503
                    response = client.post(f"/hooks/providers/{mine.pk}", content=body, headers=headers)
                    statuses.append(response.status_code)
                    if response.status_code != 503:
                        break
                    assert response.headers["Retry-After"]
                assert response.status_code == 200, response.text
            assert _terminate(app_name) >= 1, "the worker's sessions were there to terminate"
    assert set(statuses) <= {200, 503}
    assert NotificationEvent.objects.filter(notification_id__in=notes).count() == 12
    assert ReceiptDedup.objects.filter(provider_id=mine.pk).count() == 12


def test_the_asgi_environ_reads_as_the_wsgi_one():
    scope = {
        "type": "http", "method": "POST", "path": "/hooks/providers/7", "query_string": b"n=1&x=%20",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"12"), (b"webhook-id", b"msg_1"),
                    (b"x-twilio-signature", b"sig="), (b"x-forwarded-for", b"a"), (b"x-forwarded-for", b"b")],
    }  # fmt: skip
    environ = _environ(scope)
    assert environ["PATH_INFO"] == "/hooks/providers/7" and environ["QUERY_STRING"] == "n=1&x=%20"
    assert (environ["CONTENT_TYPE"], environ["CONTENT_LENGTH"]) == ("application/json", "12")
    headers = EnvironHeaders(environ)
    assert headers["Webhook-Id"] == "msg_1" and headers.get("x-twilio-signature") == "sig="
    assert headers["X-Forwarded-For"] == "a,b"  # repeated headers joined, as a WSGI server joins them


def _run_asgi(app, scope: dict, messages: list[dict]) -> list[dict]:  # noqa: ANN001
    """Call an ASGI app with `messages` as what the client sends; what it sends back."""
    incoming, sent = list(messages), []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


@pytest.fixture
def fast_path(settings, monkeypatch):  # noqa: ANN001, ANN201
    """receipts.asgi in front of an app that must not be reached, its `answer` recorded."""
    settings.OMNIPOST_PUBLIC_URL = "http://testserver"
    answered = []
    monkeypatch.setattr(receipts_asgi, "answer", lambda provider_id, environ: answered.append(provider_id) or
                        (200, {"received": 1}, {}))  # fmt: skip

    async def django(scope, receive, send):  # noqa: ANN001, ANN202
        raise AssertionError(f"reached Django: {scope['type']}")

    app = receipts_asgi.ReceiptsFastPathASGI(django)
    app.answered = answered
    return app


SCOPE = {"type": "http", "method": "POST", "path": "/hooks/providers/5", "query_string": b"",
         "headers": [(b"content-type", b"application/json")]}  # fmt: skip


@pytest.mark.django_db(transaction=False)
def test_a_vendor_that_hangs_up_mid_body_is_neither_answered_nor_applied(fast_path):
    sent = _run_asgi(fast_path, SCOPE, [{"type": "http.request", "body": b'{"type": "deli', "more_body": True},
                                        {"type": "http.disconnect"}])  # fmt: skip
    assert sent == [] and fast_path.answered == []


@pytest.mark.django_db(transaction=False)
def test_a_body_over_the_limit_in_pieces_is_413_without_being_applied(fast_path):
    piece = {"type": "http.request", "body": b" " * 65536, "more_body": True}
    sent = _run_asgi(fast_path, SCOPE, [piece] * (MAX_BODY_BYTES // 65536 + 1))
    assert sent[0]["status"] == 413 and json.loads(sent[1]["body"])["error"]["code"] == "request_too_large"
    assert fast_path.answered == []
    whole = _run_asgi(fast_path, SCOPE, [{"type": "http.request", "body": b"{}", "more_body": False}])
    assert whole[0]["status"] == 200 and fast_path.answered == [5]


@pytest.mark.django_db(transaction=False)
def test_lifespan_is_answered_here_and_the_pool_stops_at_shutdown(fast_path):
    pool = fast_path.pool()
    held = pool.submit(time.sleep, 0.2)  # a request still being answered when shutdown comes
    sent = _run_asgi(fast_path, {"type": "lifespan"}, [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert held.done(), "the pool finished what it held before shutdown was complete"
    with pytest.raises(RuntimeError):
        pool.submit(print)  # shut down


def test_the_pool_takes_its_size_from_the_setting(settings):
    settings.OMNIPOST_RECEIPTS_THREADS = 3
    app = receipts_asgi.ReceiptsFastPathASGI(None)  # type: ignore[arg-type]
    try:
        assert app.pool()._max_workers == 3
    finally:
        app.pool().shutdown()


@pytest.mark.parametrize(("raw", "message"), [("0", "an integer >= 1, got '0'"), ("two", "an integer, got 'two'")])
def test_a_bad_thread_count_stops_start_up_with_one_line(raw, message):
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "check"], cwd=web.ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings", "DEBUG": "true",
             "OMNIPOST_RECEIPTS_THREADS": raw},
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert lines[0] == f"OmniPost configuration error: OMNIPOST_RECEIPTS_THREADS must be {message}"
