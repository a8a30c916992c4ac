"""The HTTP client the HTTP providers send with: core.http guarded by the SSRF check; and `fetch`, a
one-off guarded GET for synchronous code (the SNS signing certificate, a subscription confirmation)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from core.http import HttpClient, Response
from providers import ssrf


def new_client(*, allow_private: bool | None = None, **options: Any) -> HttpClient:
    """A pooled client that refuses non-public resolved addresses at connect time.

    `allow_private=None` reads OMNIPOST_ALLOW_PRIVATE_DESTINATIONS at every new connection; other
    options go to HttpClient (max_connections_per_host, ssl_context, resolver, ...)."""
    return HttpClient(guard=partial(ssrf.check_addresses, allow_private=allow_private), **options)


def fetch(
    url: str,
    *,
    timeout: float = 10.0,
    max_body_bytes: int = 64 * 1024,
    headers: dict[str, str] | None = None,
    allow_private: bool | None = None,
) -> Response:
    """One GET through the SSRF guard from synchronous code (a web request handler): a fresh client
    on a private event loop, closed afterwards. `timeout` bounds the whole request; a body above
    `max_body_bytes` comes back with `truncated=True`. Raises HttpError subclasses or
    DestinationForbidden; never follows redirects."""

    async def run() -> Response:
        client = new_client(allow_private=allow_private, max_body_bytes=max_body_bytes, max_connections_per_host=1)
        try:
            return await client.request("GET", url, headers=headers or {}, timeout=timeout)
        finally:
            await client.aclose()

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no loop in this thread
        return asyncio.run(run())
    with ThreadPoolExecutor(1, thread_name_prefix="omnipost-fetch") as pool:  # called from async code
        return pool.submit(asyncio.run, run()).result()
