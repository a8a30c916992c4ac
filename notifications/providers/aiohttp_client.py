"""The webhook and Twilio providers' HTTP transport on aiohttp, with the guarantees of ours (http.py).

Selected with OMNIPOST_HTTP_CLIENT=aiohttp (see `new_client`). What it keeps from the hand-written
client, and how:

- the SSRF guard on the resolved address at connect time: `PinningResolver` (an aiohttp
  `AbstractResolver`) resolves once, checks every candidate with notifications.ssrf and returns
  the checked IPs, which the connector dials (Host and SNI keep the name); the connector's DNS
  cache is off, so every new connection is resolved and checked again, and nothing resolves twice.
  aiohttp does not ask a resolver about IP literals, so those are checked before the request;
- no redirects (`allow_redirects=False`: a 3xx is a response, which the providers refuse);
- one deadline per request: `ClientTimeout(total=timeout)` covers the pool wait, DNS, connect, TLS,
  the write and the whole response body;
- the body cap: at most `max_body_bytes` are read, the response is marked truncated and its
  connection closed;
- a cancelled or timed-out request aborts its connection's transport (what is still buffered is
  dropped, so the server cannot receive the rest of the request later); aiohttp alone would close
  it gracefully, flushing the buffer;
- the errors are the same DeliveryError subclasses (http.HttpTimeout, HttpConnectError, ...);
- a pool per host of `max_connections_per_host` (256) connections, no overall limit.
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import socket
import ssl
import weakref
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from django.conf import settings
from yarl import URL

from notifications import ssrf
from notifications.providers.http import (
    DEFAULT_MAX_BODY_BYTES,
    USER_AGENT,
    HttpClient,
    HttpConnectError,
    HttpDnsError,
    HttpProtocolError,
    HttpTimeout,
    HttpTlsError,
    OnDone,
    Origin,
    Resolver,
    Response,
    default_ssl_context,
    split_url,
)

CLIENTS = ("builtin", "aiohttp")

# The transports of the connections a request's task took, so that a cancel or a timeout can abort
# them (set per task: each request runs in its own).
_taken: contextvars.ContextVar[list] = contextvars.ContextVar("omnipost_http_taken")


def new_client(**options: Any) -> HttpClient | AiohttpClient:
    """The HTTP client settings.OMNIPOST_HTTP_CLIENT names (`builtin`, the default, or `aiohttp`)."""
    kind = getattr(settings, "OMNIPOST_HTTP_CLIENT", "builtin")
    if kind == "aiohttp":
        return AiohttpClient(**options)
    if kind != "builtin":
        raise ValueError(f"OMNIPOST_HTTP_CLIENT must be one of {', '.join(CLIENTS)}, not {kind!r}")
    return HttpClient(**options)


class PinningResolver(AbstractResolver):
    """Resolve once, refuse non-public answers, hand the connector the addresses that were checked."""

    def __init__(self, allow_private: bool | None, resolver: Resolver | None = None) -> None:
        self.allow_private = allow_private
        self._resolver = resolver

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list:
        try:
            if self._resolver is not None:
                infos = await self._resolver(host, port)
            else:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
                )
        except socket.gaierror as exc:
            raise HttpDnsError(f"cannot resolve {host}: {exc.strerror or exc}") from exc
        if not infos:
            raise HttpDnsError(f"cannot resolve {host}: no addresses")
        ssrf.check_addresses(host, (info[4][0] for info in infos), allow_private=self.allow_private)
        return [
            ResolveResult(hostname=host, host=info[4][0], port=port, family=info[0], proto=info[2], flags=0)
            for info in infos
        ]

    async def close(self) -> None:
        pass


class _Connector(aiohttp.TCPConnector):
    async def connect(self, req, traces, timeout):  # noqa: ANN001, ANN201 - aiohttp's signature
        conn = await super().connect(req, traces, timeout)
        taken = _taken.get(None)
        if taken is not None:
            taken.append((conn.protocol, conn.transport))
        return conn


class _Handle:
    """What `start()` returns: `cancel()` gives the request up; its callback then never comes."""

    __slots__ = ("task", "done")

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.done = False

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            self.task.cancel()  # type: ignore[union-attr]


@lru_cache(maxsize=1024)
def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class AiohttpClient:
    """`HttpClient`'s interface (start / send / request / aclose) over an aiohttp ClientSession.

    Requests carry a header dict instead of a serialised head (`build_headers`); the session is
    bound to the event loop that first uses it and replaced when used from another one.
    """

    raw_head = False

    def __init__(
        self,
        *,
        max_connections_per_host: int = 256,
        keepalive_expiry: float = 4.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        allow_private: bool | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.max_connections_per_host = max_connections_per_host
        self.keepalive_expiry = keepalive_expiry
        self.max_body_bytes = max_body_bytes
        self.allow_private = allow_private
        self._ssl_context = ssl_context
        self._resolver = resolver
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._urls: dict[tuple, Any] = {}
        self._tasks: set[asyncio.Task] = set()
        self._used: weakref.WeakSet = weakref.WeakSet()  # connections that have carried a response

    def connection_count(self) -> int:
        connector = self._session.connector if self._session is not None else None
        return 0 if connector is None else len(connector._conns) + len(connector._acquired)  # noqa: SLF001

    def _bind(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or loop is not self._loop:
            self._loop = loop
            connector = _Connector(
                limit=0,
                limit_per_host=self.max_connections_per_host,
                keepalive_timeout=self.keepalive_expiry,
                use_dns_cache=False,
                resolver=PinningResolver(self.allow_private, self._resolver),
                ssl=self._ssl_context or default_ssl_context(),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding",),
                headers={"User-Agent": USER_AGENT},
            )
            self._tasks = set()
        return self._session

    def _url(self, origin: Origin, target: str):  # noqa: ANN202 - a yarl.URL
        key = (origin.key, target)
        url = self._urls.get(key)
        if url is None:
            url = self._urls[key] = URL(
                f"{origin.scheme}://{origin.host_header.decode('ascii')}{target}", encoded=True
            )
        return url

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | Iterable[tuple[str, str]] = (),
        body: bytes = b"",
        timeout: float = 10.0,
    ) -> Response:
        origin, target = split_url(url)
        return await self._fetch(method, origin, target, dict(headers), body, timeout)

    async def send(self, origin: Origin, head: tuple[str, dict], body: bytes, timeout: float) -> Response:
        """`head` is (target, headers) as `build_headers` makes it."""
        return await self._fetch("POST", origin, head[0], head[1], body, timeout)

    def start(
        self, origin: Origin, head: tuple[str, dict], body: bytes, timeout: float, on_done: OnDone
    ) -> _Handle:
        """As HttpClient.start: `on_done(response, None)` or `on_done(None, error)` once, on the loop,
        never from within this call and never after `cancel()`. One task per request (aiohttp's way)."""
        if self._closed:
            raise HttpConnectError("client closed")
        self._bind()
        handle = _Handle()
        task = self._loop.create_task(self._run(handle, origin, head, body, timeout, on_done))  # type: ignore[union-attr]
        handle.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return handle

    async def _run(
        self, handle: _Handle, origin: Origin, head: tuple[str, dict], body: bytes, timeout: float, on_done: OnDone
    ) -> None:
        try:
            response = await self._fetch("POST", origin, head[0], head[1], body, timeout)
        except asyncio.CancelledError:
            if not handle.done:  # aclose(), not the caller's cancel(): say so, as HttpClient does
                handle.done = True
                on_done(None, HttpConnectError("client closed"))
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the callback
            result: tuple = (None, exc)
        else:
            result = (response, None)
        if handle.done:
            return
        handle.done = True
        try:
            on_done(*result)
        except Exception as exc:  # noqa: BLE001 - the caller's bug must not break the client
            self._loop.call_exception_handler({"message": "HTTP request callback failed", "exception": exc})  # type: ignore[union-attr]

    async def _fetch(
        self, method: str, origin: Origin, target: str, headers: dict, body: bytes, timeout: float
    ) -> Response:
        if self._closed:
            raise HttpConnectError("client closed")
        session = self._bind()
        if _is_ip(origin.host):  # aiohttp dials IP literals without asking the resolver
            ssrf.check_addresses(origin.host, (origin.host,), allow_private=self.allow_private)
        client_timeout = self._timeouts.get(timeout)
        if client_timeout is None:
            client_timeout = self._timeouts[timeout] = aiohttp.ClientTimeout(total=timeout)
        retried = False
        while True:
            taken: list = []
            _taken.set(taken)
            try:
                async with session.request(
                    method,
                    self._url(origin, target),
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                    timeout=client_timeout,
                ) as resp:
                    data, truncated = await self._read(resp)
                    response = Response(resp.status, resp.reason or "", _joined(resp.headers), data, truncated)
                    if truncated:
                        resp.close()
                    self._used.update(protocol for protocol, _ in taken)
                    return response
            except BaseException as exc:
                reused = any(protocol in self._used for protocol, _ in taken)
                for protocol, transport in taken:  # aiohttp closed it gracefully; drop what it would flush
                    self._used.discard(protocol)
                    if transport is not None:
                        transport.abort()
                if isinstance(exc, asyncio.CancelledError | ssrf.DestinationForbidden | HttpDnsError):
                    raise
                if reused and not retried and isinstance(exc, aiohttp.ServerDisconnectedError):
                    # A kept-alive connection the server had closed: replaced once, as HttpClient does
                    # (aiohttp retries only idempotent methods).
                    retried = True
                    continue
                raise _translate(exc, origin, waited=not taken) from exc

    async def _read(self, resp: aiohttp.ClientResponse) -> tuple[bytes, bool]:
        limit = self.max_body_bytes
        length = resp.content_length
        if length is not None and length <= limit:
            return await resp.read(), False
        buf = bytearray()
        content = resp.content
        while len(buf) <= limit:
            chunk = await content.read(limit + 1 - len(buf))
            if not chunk:
                return bytes(buf), False
            buf += chunk
        return bytes(buf[:limit]), True

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None


def _joined(headers: Any) -> dict[str, str]:
    """Lower-case names, repeated headers joined with ", " (as Response promises)."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def _translate(exc: BaseException, origin: Origin, *, waited: bool) -> Exception:
    """aiohttp's exceptions as the DeliveryError subclasses http.py raises (same codes)."""
    where = f"{origin.host}:{origin.port}"
    if isinstance(exc, TimeoutError):  # aiohttp's timeout errors are asyncio.TimeoutError too
        if waited:
            return HttpTimeout("no free connection in the pool before the timeout")
        return HttpTimeout(f"no complete response from {where} before the timeout")
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return HttpDnsError(f"cannot resolve {origin.host}: {exc.os_error}")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError | ssl.SSLError):
        return HttpTlsError(f"TLS handshake with {origin.host} failed: {exc}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return HttpConnectError(f"cannot connect to {where}: {exc.os_error.strerror or exc.os_error}")
    if isinstance(exc, aiohttp.ClientResponseError | aiohttp.ClientPayloadError):
        return HttpProtocolError(f"malformed response from {where}: {exc}")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError | OSError):
        return HttpConnectError(f"connection to {where} failed: {exc}")
    if isinstance(exc, aiohttp.ClientError):
        return HttpProtocolError(f"request to {where} failed: {exc}")
    return exc if isinstance(exc, Exception) else HttpConnectError(str(exc))

