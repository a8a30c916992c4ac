"""Time-ordered UUIDs (version 7, RFC 9562) for rows that are written and read in creation order.

A notification is read and written by its id at every step of its delivery (the claim's join,
the status update, the attempt row's unique key, the queue's one-live-item key). With random
(version 4) ids each of those is a descent to a random leaf of a B-tree; with ids that grow with
time, the rows a batch touches sit side by side in every index, and inserts land on the
right-most leaf instead of splitting pages all over the index.

Layout (RFC 9562 section 5.7, with section 6.2 method 3 for the 12 bits after the milliseconds):
48 bits of Unix milliseconds, the version (7), 12 bits of sub-millisecond time, the variant, and
62 random bits. Ids made one after another in a process sort in the order they were made, to
the clock's resolution; across processes, to the millisecond.
"""

from __future__ import annotations

import os
import time
import uuid

_VERSION_7 = 0x7 << 76
_VARIANT_RFC = 0x2 << 62


def uuid7(now_ns: int | None = None) -> uuid.UUID:
    """A new version 7 UUID for the given time (nanoseconds since the epoch; default now)."""
    ns = time.time_ns() if now_ns is None else now_ns
    millis, rest = divmod(ns, 1_000_000)
    sub_ms = rest * 4096 // 1_000_000  # 12 bits of the millisecond's fraction
    random_62 = int.from_bytes(os.urandom(8), "big") >> 2
    return uuid.UUID(int=(millis & 0xFFFF_FFFF_FFFF) << 80 | _VERSION_7 | sub_ms << 64 | _VARIANT_RFC | random_62)
