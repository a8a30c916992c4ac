"""The live stream's tests: a Server-Sent Events client over a plain socket (the servers:
tests.support.web)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Event:
    kind: str
    id: str | None
    data: dict

    @property
    def notification_id(self) -> str:
        return self.data["notification_id"]


@dataclass
class EventStream:
    """`GET /inbox/v1/stream` read one event at a time, each read bounded by a timeout."""

    url: str
    token: str | None
    last_event_id: str | None = None
    origin: str | None = None
    path: str = "/inbox/v1/stream"
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    _conn: http.client.HTTPConnection | None = None
    _response: http.client.HTTPResponse | None = None

    def open(self) -> EventStream:
        host, port = self.url.removeprefix("http://").split(":")
        self._conn = http.client.HTTPConnection(host, int(port), timeout=15)
        headers = {"Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        if self.origin:
            headers["Origin"] = self.origin
        self._conn.request("GET", self.path, headers=headers)
        self._response = self._conn.getresponse()
        self.status = self._response.status
        self.headers = {k.lower(): v for k, v in self._response.getheaders()}
        if self.status != 200:
            self.body = self._response.read()
        return self

    def next(self, timeout: float = 30) -> Event | None:
        """The next event (comments skipped); None at the end of the stream."""
        assert self._response is not None and self._conn is not None
        self._conn.sock.settimeout(timeout)
        kind, event_id, data = "message", None, []
        while True:
            try:
                raw = self._response.readline()
            except (http.client.IncompleteRead, ConnectionError):
                return None
            if not raw:
                return None
            line = raw.decode().rstrip("\r\n")
            if not line:
                if data:
                    return Event(kind, event_id, json.loads("\n".join(data)))
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                kind = value
            elif name == "id":
                event_id = value
            elif name == "data":
                data.append(value)

    def next_of(self, kind: str, timeout: float = 30) -> Event:
        """The next event of `kind`, skipping others."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind} event in {timeout}s"
            got = self.next(left)
            assert got is not None, f"the stream ended before a {kind} event"
            if got.kind == kind:
                return got

    def comments(self, count: int, timeout: float = 30) -> list[tuple[float, str]]:
        """The next `count` comment lines (events skipped), each with the monotonic time it was read."""
        assert self._response is not None and self._conn is not None
        deadline = time.monotonic() + timeout
        got: list[tuple[float, str]] = []
        while len(got) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(got)} comment lines in {timeout}s, not {count}"
            self._conn.sock.settimeout(left)
            raw = self._response.readline()
            assert raw, "the stream ended"
            if raw.startswith(b":"):
                got.append((time.monotonic(), raw.decode().rstrip("\r\n")))
        return got

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@contextmanager
def stream(url: str, token: str | None, **kwargs: str | None) -> Iterator[EventStream]:
    opened = EventStream(url, token, **kwargs).open()
    try:
        yield opened
    finally:
        opened.close()


def silent_stream(url: str, token: str) -> socket.socket:
    """A stream opened by a client that never reads (its receive buffer as small as the kernel allows)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect((host, int(port)))
    sock.sendall(f"GET /inbox/v1/stream HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                 "Accept: text/event-stream\r\nConnection: close\r\n\r\n".encode())  # fmt: skip
    return sock
