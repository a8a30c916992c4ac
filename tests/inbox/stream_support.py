"""The live stream's tests: the web process as an ASGI server (granian, the Procfile's server, on its
ASGI interface) on a loopback port, and a Server-Sent Events client over a plain socket."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.pgserver import free_port
from tests.support.web import Served

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def asgi_web(env: Mapping[str, str], port: int | None = None) -> Iterator[Served]:
    """One granian ASGI process (omnipost_site.asgi, one worker) on `port` (a free one by default), up
    when /healthz answers; stopped with SIGTERM (killed after 10 s) when the block ends."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "granian", "--interface", "asgi", "omnipost_site.asgi:application", "--host",
         "127.0.0.1", "--port", str(port), "--workers", "1", "--no-ws", "--workers-kill-timeout", "5",
         "--log-level", "warning"],
        env={"OMNIPOST_LOG_LEVEL": "WARNING", **env, "OMNIPOST_PUBLIC_URL": url}, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "granian did not come up"
            time.sleep(0.1)
        yield Served(url, proc)
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


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
        self._conn.request("GET", "/inbox/v1/stream", headers=headers)
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
