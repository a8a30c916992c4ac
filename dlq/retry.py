"""Retry policy: exponential backoff with full jitter, honouring Retry-After.

delay(n) = uniform(0, min(cap, base * 2^(n-1))) for the n-th failed attempt (n >= 1); when the
destination sent Retry-After, the delay is at least that long. A Retry-After is trusted up to
`max_retry_after` (default 24 h, or the cap when that is larger) so a hostile or broken header
cannot park a notification for years; it is allowed to exceed `cap`, because retrying before the
time the destination asked for only earns another 429/503.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from providers.kinds.base import parse_retry_after

DEFAULT_MAX_RETRY_AFTER = 24 * 3600.0

__all__ = ["DEFAULT_MAX_RETRY_AFTER", "RetryPolicy", "exhausted", "parse_retry_after"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base: float
    cap: float
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap <= 0:
            raise ValueError("retry base and cap must be positive")

    @classmethod
    def from_settings(cls) -> RetryPolicy:
        """OMNIPOST_RETRY_BASE_SECONDS / OMNIPOST_RETRY_MAX_SECONDS, read at call time."""
        from django.conf import settings

        cap = float(settings.OMNIPOST_RETRY_MAX_SECONDS)
        return cls(
            base=float(settings.OMNIPOST_RETRY_BASE_SECONDS),
            cap=cap,
            max_retry_after=max(DEFAULT_MAX_RETRY_AFTER, cap),
        )

    def ceiling(self, attempt: int) -> float:
        """Upper bound of the jitter window after the `attempt`-th failure (1-based)."""
        exponent = max(0, attempt - 1)
        if exponent >= 64:  # 2**64 * base is beyond any cap; avoid float overflow for absurd counts
            return self.cap
        return min(self.cap, self.base * (2**exponent))

    def delay(self, attempt: int, retry_after: float | None = None, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait before the next attempt; `rng` returns a float in [0, 1)."""
        delay = rng() * self.ceiling(attempt)
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(float(retry_after), self.max_retry_after))
        return delay


def exhausted(attempt_count: int, max_attempts: int) -> bool:
    """True once `attempt_count` attempts have used up a budget of `max_attempts`."""
    return attempt_count >= max_attempts
