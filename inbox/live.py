"""`GET /inbox/v1/stream`: a subscriber's feed, live, as Server-Sent Events, served on the ASGI
application's event loop (omnipost_site.asgi) before Django's handler.

One hub per web process: one LISTEN connection (`omnipost_inbox`, sent once per statement that changes
feeds by the trigger on inbox_counts) fans out to every open stream of the process, and a small pool of
connections reads the feeds. A notification only wakes the streams of the subscribers it names; the
woken streams read, in one statement for all of them, their items after the last `seq` each sent
(inbox_items.seq commits in order per subscriber, inbox.statements), so the table is the stream's
queue: nothing waits in memory but the flag "woken" and at most one page, however many items were
written or however slow the client is.

- `id:` of every event is the subscriber's `seq` it has reached; a reconnect's `Last-Event-ID` (or
  `?last_event_id=`) replays the items after it, written at most 24 h ago. Without one, the stream
  starts at the newest item with a `counts` event.
- A comment line every OMNIPOST_INBOX_HEARTBEAT_SECONDS (15 s).
- A client that takes longer than OMNIPOST_INBOX_SEND_TIMEOUT_SECONDS (10 s) to take an event is cut
  off (it reconnects with its Last-Event-ID and replays); it never holds up another stream, each
  stream being its own task.
- A lost LISTEN connection is reconnected with backoff, then every stream re-reads its feed (what was
  sent in between is replayed); the hub never gives up while the process runs.
- The token is the one /inbox/v1/ takes (`Authorization: Bearer`, or `?token=` since EventSource sends
  no headers); expired, forged or revoked → 401. CORS as the rest of /inbox/v1/ (inbox.cors); a
  request the WSGI web process redirected here arrives from a browser with `Origin: null`, and is
  granted `null` when its `redirected_from` is an origin the tenant allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import psycopg
from django.conf import settings

from core import pooling
from inbox import statements, tokens

logger = logging.getLogger(__name__)

PATH = "/inbox/v1/stream"
CHANNEL = "omnipost_inbox"
# What a stream reads at a time: at most PAGE items, and past PAGE_BYTES of content only its first item.
# A stream holds at most two pages (the one its client is taking, the one it waits to send).
PAGE = 32
PAGE_BYTES = 256 * 1024
REPLAY_HOURS = 24
POOL_SIZE = 4

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def subscriber_key(tenant_id: object, subscriber: str) -> str:
    """The key the NOTIFY names a subscriber by (the trigger's left(md5(tenant_id::text || ':' || subscriber), 8))."""
    return hashlib.md5(f"{tenant_id}:{subscriber}".encode(), usedforsecurity=False).hexdigest()[:8]


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, None) or os.environ.get(name) or default)


# --- the statements the stream runs ---------------------------------------------------------------
# Opening a stream: the token's generation (None once the subscriber is gone), the tenant's origins,
# and where the feed is (one statement).
_OPEN = f"""
    SELECT ({statements.LIVE_GENERATION}) AS generation,
           (SELECT allowed_origins FROM inbox_settings WHERE tenant_id = %(tenant)s) AS origins,
           (SELECT last_seq FROM inbox_counts WHERE tenant_id = %(tenant)s AND subscriber = %(subscriber)s)"""  # noqa: S608

_COLUMNS = ", ".join(f"i.{c}" for c in statements.ITEM_COLUMNS)
# The woken streams, all in one statement: each one's items after its `seq` (inbox_stream_idx; written
# in the last 24 h) and its counts, read in one snapshot, so the counts never run ahead of the items
# sent with them; and the token's subscriber's generation again, so a revoke ends the streams open with
# the token at their next event. One row per stream without items, one per item otherwise, by `k`.
_SIZE = "octet_length(i.title) + octet_length(i.body) + octet_length(i.data::text) + octet_length(i.action_url)"
_READ = f"""
    SELECT r.k, c.unseen, c.unread, c.total, c.last_seq,
           (SELECT coalesce((SELECT v.generation FROM inbox_token_revocations v
                             WHERE v.tenant_id = r.tenant_id AND v.subscriber = r.subscriber), 0)
            FROM subscribers x WHERE x.tenant_id = r.tenant_id AND x.external_id = r.subscriber) AS generation,
           i.seq, {_COLUMNS}
    FROM unnest(%(k)s::int[], %(tenant)s::uuid[], %(subscriber)s::text[], %(after)s::bigint[])
         AS r(k, tenant_id, subscriber, after)
    LEFT JOIN inbox_counts c ON c.tenant_id = r.tenant_id AND c.subscriber = r.subscriber
    LEFT JOIN LATERAL (
        SELECT * FROM (
            SELECT i.*, sum({_SIZE}) OVER (ORDER BY i.seq) - ({_SIZE}) AS before
            FROM (SELECT * FROM inbox_items i
                  WHERE i.tenant_id = r.tenant_id AND i.subscriber = r.subscriber AND i.seq > r.after
                    AND i.created_at > now() - interval '{REPLAY_HOURS} hours'
                  ORDER BY i.seq LIMIT {PAGE}) i
        ) i
        WHERE i.before < {PAGE_BYTES}  -- the first item always, then up to PAGE_BYTES
    ) i ON true
    ORDER BY r.k, i.seq"""  # noqa: S608
MAX_BATCH = 500  # streams read by one statement


def _when(value: datetime | None) -> str | None:
    """A time as the REST API writes it (DRF: ISO 8601, UTC as `Z`)."""
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _item(row: tuple) -> tuple[int, dict[str, Any]]:
    seq, *values = row
    item = dict(zip(statements.ITEM_COLUMNS, values, strict=True))
    for name in ("id", "notification_id"):
        item[name] = str(item[name])
    for name in ("created_at", "seen_at", "read_at", "archived_at"):
        item[name] = _when(item[name])
    return int(seq), item


def event(kind: str, event_id: int, data: dict[str, Any]) -> bytes:
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


# --- connections -----------------------------------------------------------------------------------
class _Pool:
    """A few autocommit connections for the streams' reads, each made when first needed and dropped
    after any error (the next read makes a new one)."""

    def __init__(self, size: int) -> None:
        self._free: asyncio.Queue = asyncio.Queue()
        for _ in range(size):
            self._free.put_nowait(None)

    async def fetchall(self, sql: str, params: Any) -> list[tuple]:  # noqa: ANN401
        """The statement's rows; a connection found dead (the server restarted, the session was
        terminated) is replaced once, then the error is the caller's."""
        try:
            return await self._fetchall(sql, params)
        except psycopg.OperationalError:
            self._drop_idle()  # the others most likely died with it
            return await self._fetchall(sql, params)

    def _drop_idle(self) -> None:
        idle = []
        while not self._free.empty():
            idle.append(self._free.get_nowait())
        for conn in idle:
            if conn is not None:
                asyncio.get_running_loop().create_task(conn.close())
            self._free.put_nowait(None)

    async def _fetchall(self, sql: str, params: Any) -> list[tuple]:  # noqa: ANN401
        conn = await self._free.get()
        try:
            if conn is None or conn.closed:
                params_ = pooling.notify_params("default")
                params_["application_name"] = f"omnipost-inbox-stream-{socket.gethostname()}-{os.getpid()}"[:63]
                # behind a transaction pooler nothing may be prepared server-side (core.pooling)
                threshold = 5 if pooling.prepare() else None
                conn = await psycopg.AsyncConnection.connect(**params_, connect_timeout=5, prepare_threshold=threshold)
            cursor = await conn.execute(sql, params)
            return await cursor.fetchall()
        except BaseException:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
            conn = None
            raise
        finally:
            self._free.put_nowait(conn)

    async def close(self) -> None:
        while not self._free.empty():
            conn = self._free.get_nowait()
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()


class Stream:
    __slots__ = ("key", "woken")

    def __init__(self, key: str) -> None:
        self.key = key
        self.woken = asyncio.Event()


class Hub:
    """The process's LISTEN connection and its open streams (made on the loop of the first stream)."""

    def __init__(self) -> None:
        self.streams: dict[str, set[Stream]] = {}
        self.pool = _Pool(POOL_SIZE)
        self.listening = asyncio.Event()
        self.stopping = asyncio.Event()
        self.reconnects = 0
        self._asked: list[tuple[tokens.Claims, int, asyncio.Future]] = []
        self._asking = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._listen(), name="inbox-listen")
        self._reader = loop.create_task(self._read_batches(), name="inbox-read")

    async def read(self, claims: tokens.Claims, after: int) -> list[tuple]:
        """The stream's rows of `_READ` (without `k`), read with those of every other stream woken
        meanwhile: a notification that wakes a hundred streams costs one statement, not a hundred."""
        future = asyncio.get_running_loop().create_future()
        self._asked.append((claims, after, future))
        self._asking.set()
        return await future

    async def _read_batches(self) -> None:
        while True:
            await self._asking.wait()
            self._asking.clear()
            while self._asked:
                batch, self._asked = self._asked[:MAX_BATCH], self._asked[MAX_BATCH:]
                try:
                    params = {"k": list(range(len(batch))), "tenant": [c.tenant_id for c, _, _ in batch],
                              "subscriber": [c.subscriber for c, _, _ in batch],
                              "after": [after for _, after, _ in batch]}  # fmt: skip
                    rows = await self.pool.fetchall(_READ, params)
                except Exception as exc:  # noqa: BLE001 - each stream asking decides (it ends)
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                by_stream: list[list[tuple]] = [[] for _ in batch]
                for row in rows:
                    by_stream[row[0]].append(row[1:])
                for (_, _, future), mine in zip(batch, by_stream, strict=True):
                    if not future.done():
                        future.set_result(mine)

    def open(self, stream: Stream) -> None:
        self.streams.setdefault(stream.key, set()).add(stream)

    def close(self, stream: Stream) -> None:
        group = self.streams.get(stream.key)
        if group is not None:
            group.discard(stream)
            if not group:
                del self.streams[stream.key]

    def wake(self, payload: str) -> None:
        if payload == "*":
            self.wake_all()
            return
        for key in payload.split(","):
            for stream in self.streams.get(key, ()):
                stream.woken.set()

    def wake_all(self) -> None:
        for group in self.streams.values():
            for stream in group:
                stream.woken.set()

    async def _listen(self) -> None:
        name = f"omnipost-inbox-listen-{socket.gethostname()}-{os.getpid()}"
        backoff = 0.1
        while not self.stopping.is_set():
            params = pooling.listen_params("default", name)
            if params is None:  # behind a pooler with no direct URL: poll every second instead
                self.listening.set()
                self.wake_all()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), 1.0)
                continue
            try:
                conn = await psycopg.AsyncConnection.connect(
                    **params, connect_timeout=5, keepalives=1, keepalives_idle=10, keepalives_interval=5,
                    keepalives_count=3,
                )  # fmt: skip
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    self.wake_all()  # what was written while no one listened: every stream re-reads
                    backoff = 0.1
                    async for note in conn.notifies():
                        self.wake(note.payload)
                raise ConnectionError("the LISTEN connection ended")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure of the connection: reconnect, then replay
                self.listening.clear()
                self.reconnects += 1
                if not self.stopping.is_set():
                    logger.warning("inbox stream LISTEN failed (%s); reconnecting in %.1fs", exc, backoff)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), backoff)
                backoff = min(backoff * 2, 5.0)

    async def stop(self) -> None:
        self.stopping.set()
        self.wake_all()
        for task in (self._task, self._reader):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.pool.close()


_hub: Hub | None = None


def hub() -> Hub:
    global _hub
    loop = asyncio.get_running_loop()
    if _hub is None or _hub._task.get_loop() is not loop:
        _hub = Hub()
    return _hub


# --- the request ----------------------------------------------------------------------------------
def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


async def _answer(send: Send, status: int, body: dict, headers: list[tuple[bytes, bytes]]) -> None:
    content = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
                            *headers]})  # fmt: skip
    await send({"type": "http.response.body", "body": content})


def _unauthorized(message: str) -> dict:
    return {"error": {"code": "authentication_failed", "message": message, "details": {}}}


async def serve(scope: Scope, receive: Receive, send: Send) -> None:
    headers = _headers(scope)
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    origin = headers.get("origin")
    vary = [(b"vary", b"Origin")] if origin else []
    scheme, _, raw = headers.get("authorization", "").partition(" ")
    token = raw.strip() if scheme.lower() == "bearer" else (query.get("token") or [""])[0]
    if not token:
        await _answer(send, 401, _unauthorized("Use `Authorization: Bearer <inbox token>` or `?token=`."),
                      [(b"www-authenticate", b'Bearer realm="omnipost-inbox"'), *vary])  # fmt: skip
        return
    claims = tokens.decode(token)
    the_hub = hub()
    row = None
    if claims is not None:
        try:
            rows = await the_hub.pool.fetchall(_OPEN, {"tenant": claims.tenant_id, "subscriber": claims.subscriber})
        except psycopg.OperationalError as exc:
            logger.warning("inbox stream open failed (%s)", exc)
            await _answer(send, 503, {"error": {"code": "unavailable", "message": "Try again shortly.",
                                                "details": {}}}, [(b"retry-after", b"2"), *vary])  # fmt: skip
            return
        row = rows[0] if rows else None
    if claims is None or row is None or row[0] != claims.generation:
        await _answer(send, 401, _unauthorized("The inbox token is invalid, expired or revoked."),
                      [(b"www-authenticate", b'Bearer realm="omnipost-inbox"'), *vary])  # fmt: skip
        return
    _, origins, last_seq = row
    last_seq = last_seq or 0
    # A browser sends `Origin: null` on a request another origin redirected here (the WSGI web process's
    # /inbox/v1/stream, inbox.api.views.StreamRedirectView), which names the origin it came from.
    came_from = (query.get("redirected_from") or [""])[0] if origin == "null" else origin
    granted = bool(came_from) and came_from in (origins or ())
    grant = [(b"access-control-allow-origin", origin.encode("latin-1"))] if granted else []
    asked = headers.get("last-event-id") or (query.get("last_event_id") or [""])[0]
    after = int(asked) if asked.isdigit() and len(asked) < 19 else None

    stream = Stream(subscriber_key(claims.tenant_id, claims.subscriber))
    the_hub.open(stream)  # before the first read: a notification from now on wakes it
    try:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                                (b"x-accel-buffering", b"no"), *vary, *grant]})  # fmt: skip
        await _run(the_hub, stream, claims, after, last_seq, receive, send)
    finally:
        the_hub.close(stream)


async def _run(the_hub: Hub, stream: Stream, claims: tokens.Claims, after: int | None, last_seq: int,
               receive: Receive, send: Send) -> None:  # fmt: skip
    heartbeat = _setting("OMNIPOST_INBOX_HEARTBEAT_SECONDS", 15)
    send_timeout = _setting("OMNIPOST_INBOX_SEND_TIMEOUT_SECONDS", 10)
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()
        stream.woken.set()

    watcher = asyncio.get_running_loop().create_task(watch())

    async def write(body: bytes) -> bool:
        return await _sent(send({"type": "http.response.body", "body": body, "more_body": True}), send_timeout)

    # Without Last-Event-ID: from the newest item on. An id past the feed's end (not one this
    # subscriber was sent) starts there too, so it cannot hold the stream back.
    cursor = last_seq if after is None else min(after, last_seq)
    sent_counts: tuple | None = None
    try:
        if not await write(b": omnipost inbox stream\nretry: 2000\n\n"):
            return
        while not gone.is_set() and not the_hub.stopping.is_set():
            stream.woken.clear()
            try:
                rows = await the_hub.read(claims, cursor)
            except psycopg.OperationalError as exc:  # the database is away: the client reconnects and replays
                logger.warning("inbox stream read failed (%s); ending the stream", exc)
                return
            unseen, unread, total, last_seq, generation = rows[0][:5]
            if generation != claims.generation or tokens.clock() >= claims.expires_at:
                return  # revoked or expired since: the reconnect is answered 401
            items = [row[5:] for row in rows if row[5] is not None]
            out = []
            for raw in items:
                cursor, item = _item(raw)
                out.append(event("item", cursor, item))
            counts = (unseen or 0, unread or 0, total or 0)
            if counts != sent_counts:
                out.append(event("counts", cursor, dict(zip(("unseen", "unread", "total"), counts, strict=True))))
                sent_counts = counts
            if out and not await write(b"".join(out)):
                return
            if items and cursor < (last_seq or 0):
                continue  # more to replay
            while not stream.woken.is_set():
                try:
                    await asyncio.wait_for(stream.woken.wait(), heartbeat)
                except TimeoutError:
                    if tokens.clock() >= claims.expires_at or not await write(b": keep-alive\n\n"):
                        return
    finally:
        watcher.cancel()
        # bounded too: to a client that reads nothing the end of the body cannot be sent either, and
        # returning without it makes the server drop the connection
        await _sent(send({"type": "http.response.body", "body": b"", "more_body": False}), 1)


async def _sent(sending: Awaitable[None], timeout: float) -> bool:
    """Whether `sending` finished within `timeout`. The server's send waits while the one before it is
    still unwritten (granian holds one body message and the socket's buffers), and it does not give
    way to a cancellation, so it is left behind rather than awaited: the app then returns, and the
    server drops the connection (the client reconnects and replays from its last id)."""
    task = asyncio.ensure_future(sending)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        return False
    return task.exception() is None


class InboxStreamASGI:
    """`GET /inbox/v1/stream` here, everything else to `app`; at the lifespan's shutdown the streams end
    (their clients reconnect to another process, or to this one restarted, and replay)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == PATH and scope.get("method") in ("GET", "HEAD"):
            await serve(scope, receive, send)
            return
        if scope["type"] == "lifespan":
            await self.app(scope, self._on_shutdown(receive), send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _on_shutdown(receive: Receive) -> Receive:
        async def wrapped() -> MutableMapping[str, Any]:
            message = await receive()
            if message["type"] == "lifespan.shutdown" and _hub is not None:
                await _hub.stop()
            return message

        return wrapped
