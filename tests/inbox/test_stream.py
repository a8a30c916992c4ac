"""GET /inbox/v1/stream over a real server: the web process as the ASGI server (granian) on loopback and
a real dispatcher delivering in_app notifications while streams are open (inbox.live)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest
from django.db import connection

from inbox import tokens
from inbox.models import InboxItem
from tests.inbox.stream_support import silent_stream, stream
from tests.queueing.dispatch_support import drain
from tests.support.pgserver import free_port
from tests.support.web import granian, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

APP = "https://app.example.com"


class Site:
    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.api = httpx.Client(base_url=f"{url}/api/v1/", headers={"Authorization": f"Bearer {key}"}, timeout=20)

    def subscriber(self, external_id: str) -> None:
        assert self.api.put(f"subscribers/{external_id}", json={}).status_code in (200, 201)

    def token(self, external_id: str, ttl: int = 600) -> str:
        made = self.api.post(f"subscribers/{external_id}/inbox-token", json={"ttl_seconds": ttl})
        assert made.status_code == 201, made.text
        return made.json()["token"]

    def notify(self, external_id: str, subject: str, **fields: object) -> str:
        made = self.api.post("notifications", json={"channel": "in_app", "subscriber": external_id,
                                                    "subject": subject, "body": f"{subject}!", **fields})  # fmt: skip
        assert made.status_code == 201, made.text
        return made.json()["id"]

    def inbox(self, token: str, origin: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}", **({"Origin": origin} if origin else {})}
        return httpx.Client(base_url=f"{self.url}/inbox/v1/", headers=headers, timeout=20)


@pytest.fixture
def env(subprocess_env) -> dict:  # noqa: ANN001
    return {**subprocess_env, "OMNIPOST_INBOX_SEND_TIMEOUT_SECONDS": "1"}


@pytest.fixture
def site(env, key_a) -> Iterator[Site]:  # noqa: ANN001
    with granian(env) as web:
        served = Site(web.url, key_a)
        served.subscriber("jane")
        assert served.api.patch("settings", json={"inbox_allowed_origins": [APP]}).status_code == 200
        yield served


def delivered(count: int):  # noqa: ANN201
    return lambda: InboxItem.objects.count() >= count


def test_an_item_delivered_while_the_stream_is_open_arrives_and_counts_follow(site, env, tmp_path):
    token = site.token("jane")
    with stream(site.url, token, origin=APP) as live:
        assert live.status == 200 and live.headers["content-type"].startswith("text/event-stream")
        assert live.headers["access-control-allow-origin"] == APP
        first = live.next()
        assert (first.kind, first.data) == ("counts", {"unseen": 0, "unread": 0, "total": 0}) and first.id

        notification_id = site.notify("jane", "Shipped", data={"order": "42"}, action_url="/orders/42")
        drain(env, tmp_path / "d1", until=delivered(1))
        item = live.next_of("item")
        assert item.notification_id == notification_id
        assert (item.data["title"], item.data["body"], item.data["data"], item.data["action_url"]) == (
            "Shipped", "Shipped!", {"order": "42"}, "/orders/42")  # fmt: skip
        assert item.data["seen_at"] is None and item.data["read_at"] is None and item.id != first.id
        # the item is the one the feed lists, in the same shape
        assert site.inbox(token).get("feed").json()["results"] == [item.data]
        assert live.next_of("counts").data == {"unseen": 1, "unread": 1, "total": 1}

        assert site.inbox(token).post(f"feed/{item.data['id']}/read").status_code == 200
        assert live.next_of("counts").data == {"unseen": 0, "unread": 0, "total": 1}


@pytest.mark.parametrize("interval", [0.4, 1.2])
def test_heartbeats_come_at_the_configured_interval(env, key_a, interval):
    """A comment line every OMNIPOST_INBOX_HEARTBEAT_SECONDS while nothing happens (never sooner: the
    bound that can fail; the count within the timeout shows they keep coming)."""
    with granian({**env, "OMNIPOST_INBOX_HEARTBEAT_SECONDS": str(interval)}) as web:
        site = Site(web.url, key_a)
        site.subscriber("jane")
        with stream(site.url, site.token("jane")) as live:
            assert live.next().kind == "counts"
            opened = time.monotonic()
            beats = live.comments(4, timeout=30)
    assert [text for _, text in beats] == [": keep-alive"] * 4
    times = [opened] + [at for at, _ in beats]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert min(gaps) >= interval * 0.9, gaps


def test_a_reconnect_after_a_web_restart_replays_every_item_written_meanwhile_once(env, key_a, tmp_path):
    port = free_port()
    with granian(env, port) as web:
        site = Site(web.url, key_a)
        site.subscriber("jane")
        token = site.token("jane")
        with stream(site.url, token) as live:
            first_id = site.notify("jane", "one")
            drain(env, tmp_path / "d1", until=delivered(1))
            seen = live.next_of("item")
            assert seen.notification_id == first_id
            # made now, delivered while no web process runs
            meanwhile = [site.notify("jane", f"meanwhile {n}") for n in range(3)]
            stop(web.process)  # the web process goes away mid-stream
            while (rest := live.next(20)) is not None:  # the stream ends with its process
                assert rest.kind == "counts"

    drain(env, tmp_path / "d2", until=delivered(4))
    with granian(env, port) as web:  # restarted on the same address
        site = Site(web.url, key_a)
        with stream(site.url, token, last_event_id=seen.id) as again:
            replayed = [again.next_of("item").notification_id for _ in meanwhile]
            assert replayed == meanwhile
            assert again.next_of("counts").data == {"unseen": 4, "unread": 4, "total": 4}
            # nothing of the replay comes twice: the next item is the next one written
            after = site.notify("jane", "after")
            drain(env, tmp_path / "d3", until=delivered(5))
            assert again.next_of("item").notification_id == after


def test_a_lost_listen_connection_is_reconnected_and_nothing_is_missed(site, env, tmp_path):
    token = site.token("jane")
    with stream(site.url, token) as live:
        assert live.next().kind == "counts"
        # every session of the web process's stream hub ends (listener and readers)
        with connection.cursor() as cursor:
            cursor.execute("""SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                              WHERE application_name LIKE 'omnipost-inbox-%%'""")  # fmt: skip
            assert cursor.fetchone()[0] >= 1
        made = site.notify("jane", "after the cut")
        drain(env, tmp_path / "d1", until=delivered(1))
        assert live.next_of("item").notification_id == made


def test_expired_revoked_forged_or_missing_tokens_are_401(site, monkeypatch):
    live_token = site.token("jane")
    tenant_id = tokens.decode(live_token).tenant_id  # type: ignore[union-attr]
    monkeypatch.setattr(tokens, "clock", lambda: datetime.now(UTC).timestamp() - 3600)
    expired, _ = tokens.issue(tenant_id, "jane", 60)
    monkeypatch.undo()
    forged = live_token[:-4] + ("AAAA" if not live_token.endswith("AAAA") else "BBBB")
    for token in (expired, forged, "ibx_nothing", None):
        with stream(site.url, token) as refused:
            assert refused.status == 401, (token, refused.status)
            assert b"error" in refused.body

    with stream(site.url, live_token) as open_stream:
        assert open_stream.status == 200 and open_stream.next().kind == "counts"
        assert site.api.post("subscribers/jane/inbox-token/revoke").status_code == 204
        assert open_stream.next(20) is None, "a revoke ends the streams open with the token"
    with stream(site.url, live_token) as refused:
        assert refused.status == 401


def test_another_subscribers_items_are_neither_streamed_nor_reachable(site, env, tmp_path):
    site.subscriber("john")
    john = site.token("john")
    with stream(site.url, john) as johns:
        assert johns.next().kind == "counts"
        janes_id = site.notify("jane", "for jane")
        johns_id = site.notify("john", "for john")
        drain(env, tmp_path / "d1", until=delivered(2))
        assert johns.next_of("item").notification_id == johns_id
    janes_item = InboxItem.objects.get(notification_id=janes_id)
    assert site.inbox(john).post(f"feed/{janes_item.id}/read").status_code == 404
    # an id from jane's stream replays nothing of hers on john's
    with stream(site.url, john, last_event_id="0") as replay:
        assert replay.next_of("item").notification_id == johns_id
        assert replay.next_of("counts").data["total"] == 1


def test_another_origin_gets_no_cors_grant(site):
    token = site.token("jane")
    with stream(site.url, token, origin="https://evil.example.com") as other:
        assert other.status == 200
        assert "access-control-allow-origin" not in other.headers and other.headers["vary"] == "Origin"
    with stream(site.url, token, origin=APP) as allowed:
        assert allowed.headers["access-control-allow-origin"] == APP
    preflight = {"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization"}
    evil = httpx.options(f"{site.url}/inbox/v1/stream", headers={"Origin": "https://evil.example.com", **preflight})
    assert "access-control-allow-origin" not in evil.headers
    ours = httpx.options(f"{site.url}/inbox/v1/stream", headers={"Origin": APP, **preflight})
    assert ours.headers["access-control-allow-origin"] == APP


def test_a_client_that_does_not_read_holds_no_other_stream_back(site, env, tmp_path):
    token = site.token("jane")
    slow = silent_stream(site.url, token)  # never reads a byte
    try:
        with stream(site.url, token) as fast:
            assert fast.next().kind == "counts"
            # 40 events of 200 KB: more than the silent client's socket buffers take (4 MB at most here)
            made = [site.notify("jane", f"n{n}", body="x" * 200_000) for n in range(40)]
            # the fast client reads while the events are sent, as a browser does: a reader that waited
            # for the whole drain would itself be a silent client and be cut
            with ThreadPoolExecutor(1) as reader:
                reading = reader.submit(lambda: [fast.next_of("item", timeout=60).notification_id for _ in made])
                drain(env, tmp_path / "d1", until=delivered(len(made)))
                got = reading.result(timeout=90)
            assert sorted(got) == sorted(made) and len(set(got)) == len(made)
        # the cut is the server's policy in time (a send blocked OMNIPOST_INBOX_SEND_TIMEOUT_SECONDS, 1 s
        # here): stay silent past it
        time.sleep(2.5)
        # what the silent client is given when it reads at last: not all it was behind by, the stream
        # having been cut at a send that timed out (it would reconnect and replay from its last id)
        slow.settimeout(5)
        received = 0
        with contextlib.suppress(TimeoutError):
            while chunk := slow.recv(1 << 20):
                received += len(chunk)
        assert 0 < received < len(made) * 200_000
    finally:
        slow.close()
