"""The HTTP client the webhook and Twilio providers send with: core.http guarded by the SSRF check."""

from __future__ import annotations

from functools import partial
from typing import Any

from core.http import HttpClient
from notifications import ssrf


def new_client(*, allow_private: bool | None = None, **options: Any) -> HttpClient:
    """A pooled client that refuses non-public resolved addresses at connect time.

    `allow_private=None` reads OMNIPOST_ALLOW_PRIVATE_DESTINATIONS at every new connection; other
    options go to HttpClient (max_connections_per_host, ssl_context, resolver, ...)."""
    return HttpClient(guard=partial(ssrf.check_addresses, allow_private=allow_private), **options)
