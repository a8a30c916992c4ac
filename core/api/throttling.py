"""Per-tenant API rate limit (OMNIPOST_RATE_LIMIT_API requests a minute) with Retry-After.

The bucket is shared by every web process through the database (`queueing.ratelimit`, key
`api:<tenant id>`: rate = limit / 60 per second, burst = one minute's worth). core sits below the
queue, so the bucket's `take` is handed to it at start-up (`use_bucket`, called by
queueing.apps); until then every request is allowed. A process takes a
quarter second's worth of tokens at once and spends them from memory, so most requests cost no
query; tokens it holds longer than a second are dropped, so the limit holds across processes.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from rest_framework.throttling import BaseThrottle

# key, rate, burst, want -> (granted, seconds until the next token or None)
TakeTokens = Callable[[str, float, float, int], tuple[int, float | None]]
_take: TakeTokens | None = None

CHUNK_SECONDS = 0.25  # tokens taken at once, in seconds of rate
LOCAL_TTL = 1.0  # a taken token is spent within this long or dropped


def use_bucket(take: TakeTokens) -> None:
    """Hand the throttle the shared token bucket's `take` (queueing.ratelimit.take_key)."""
    global _take
    _take = take


class _Allotment:
    __slots__ = ("tokens", "taken_at")

    def __init__(self, tokens: float, taken_at: float) -> None:
        self.tokens = tokens
        self.taken_at = taken_at


class TenantRateThrottle(BaseThrottle):
    _local: dict[str, _Allotment] = {}
    _lock = threading.Lock()
    clock = staticmethod(time.monotonic)  # for the local allotment's age only

    def allow_request(self, request, view) -> bool:  # noqa: ANN001
        return self.allow_tenant(getattr(request._request, "tenant", None))

    def allow_tenant(self, tenant: Any) -> bool:  # noqa: ANN401 - core.models.Tenant or None
        """One request of `tenant`'s; False (see `wait()`) when its limit is spent."""
        if tenant is None:
            return True
        per_minute = settings.OMNIPOST_RATE_LIMIT_API
        if per_minute <= 0:  # 0 turns the limit off (documented in the README)
            return True
        key = f"api:{tenant.pk}"
        now = self.clock()
        with self._lock:
            held = self._local.get(key)
            if held is not None and held.tokens >= 1 and now - held.taken_at < LOCAL_TTL:
                held.tokens -= 1
                return True
        if _take is None:  # no bucket registered (queueing not installed)
            return True
        rate = per_minute / 60.0
        granted, wait = _take(key, rate, float(per_minute), max(1, int(rate * CHUNK_SECONDS)))
        if granted >= 1:
            with self._lock:
                self._local[key] = _Allotment(granted - 1, now)
            return True
        self._wait = wait if wait is not None else 1.0 / rate
        return False

    def wait(self) -> float:
        return float(max(1, math.ceil(getattr(self, "_wait", 1.0))))
