"""A flood of callbacks to one provider's inbound URL is answered `429` (with Retry-After), which
vendors retry, so nothing valid is lost and one provider's flood cannot take every web process.

OMNIPOST_RATE_LIMIT_RECEIPTS requests a second per provider (burst: one second's worth), shared by
every web process through the database's token buckets (`queueing.ratelimit`, key
`receipts:<provider id>`). As with the API's throttle, a process takes a quarter second's worth of
tokens at once and spends them from memory (dropping what it has not spent within a second), so the
limit costs about four short transactions a second per busy process, not one per request.
"""

from __future__ import annotations

import math
import threading
import time

from django.conf import settings

from queueing.ratelimit import take_key

CHUNK_SECONDS = 0.25
LOCAL_TTL = 1.0

_held: dict[int, list[float]] = {}  # provider id -> [tokens, taken at (monotonic)]
_lock = threading.Lock()


def admit(provider_id: int) -> float | None:
    """None if the request may proceed, else the seconds to wait (for Retry-After)."""
    rate = float(settings.OMNIPOST_RATE_LIMIT_RECEIPTS)
    if rate <= 0:
        return None
    now = time.monotonic()
    with _lock:
        held = _held.get(provider_id)
        if held is not None and held[0] >= 1 and now - held[1] < LOCAL_TTL:
            held[0] -= 1
            return None
    granted, wait = take_key(f"receipts:{provider_id}", rate, max(1.0, rate), max(1, int(rate * CHUNK_SECONDS)))
    if granted >= 1:
        with _lock:
            _held[provider_id] = [granted - 1, now]
        return None
    return wait if wait is not None else 1.0 / rate


def retry_after(wait: float) -> str:
    return str(max(1, math.ceil(wait)))


def clear() -> None:
    with _lock:
        _held.clear()
