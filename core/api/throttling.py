"""Per-tenant API rate limit (OMNIPOST_RATE_LIMIT_API requests a minute) with Retry-After."""

from __future__ import annotations

import math
import threading
import time

from django.conf import settings
from rest_framework.throttling import BaseThrottle


class _Bucket:
    __slots__ = ("tokens", "stamp")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class TenantRateThrottle(BaseThrottle):
    """Token bucket per tenant, refilled continuously at rate/60 per second, burst = one minute.

    Kept in process memory: with W web workers a tenant may reach W times the limit. The
    shared, database-backed bucket in `queueing.ratelimit` replaces this once it exists.
    """

    _buckets: dict[str, _Bucket] = {}
    _lock = threading.Lock()
    clock = staticmethod(time.monotonic)

    def allow_request(self, request, view) -> bool:  # noqa: ANN001
        tenant = getattr(request._request, "tenant", None)
        if tenant is None:
            return True
        per_minute = settings.OMNIPOST_RATE_LIMIT_API
        if per_minute <= 0:  # 0 turns the limit off (documented in the README)
            return True
        rate = per_minute / 60.0
        now = self.clock()
        with self._lock:
            bucket = self._buckets.setdefault(str(tenant.pk), _Bucket(float(per_minute), now))
            bucket.tokens = min(float(per_minute), bucket.tokens + (now - bucket.stamp) * rate)
            bucket.stamp = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return True
            self._wait = (1.0 - bucket.tokens) / rate
            return False

    def wait(self) -> float:
        return float(math.ceil(getattr(self, "_wait", 1.0)))
