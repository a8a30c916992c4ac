"""transport.fetch: a one-off guarded GET for synchronous code, also when called inside an event loop."""

from __future__ import annotations

import asyncio

import pytest

from core.http import HttpError
from providers.ssrf import DestinationForbidden
from providers.transport import fetch
from tests.support.receivers import HttpReceiver


def test_fetch_returns_the_response_and_bounds_the_body():
    with HttpReceiver(status=200, body=b"x" * 5000) as rx:
        response = fetch(rx.url, timeout=5)
        assert (response.status, len(response.body), response.truncated) == (200, 5000, False)
        assert fetch(rx.url, timeout=5, max_body_bytes=1000).truncated
        assert [r.method for r in rx.requests] == ["GET", "GET"]


def test_fetch_from_inside_a_running_loop():
    with HttpReceiver(status=204, body=b"") as rx:

        async def inside() -> int:
            return fetch(rx.url, timeout=5).status

        assert asyncio.run(inside()) == 204


def test_fetch_is_guarded(settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    with HttpReceiver() as rx:
        with pytest.raises(DestinationForbidden):
            fetch(rx.url, timeout=5)
        assert rx.requests == []


def test_fetch_times_out():
    with HttpReceiver(delay_ms=2000) as rx, pytest.raises(HttpError) as err:
        fetch(rx.url, timeout=0.3)
    assert err.value.code == "timeout"
