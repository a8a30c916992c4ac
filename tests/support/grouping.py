"""Driving core.grouping's batching from threads in a known order (receipts' and creates' tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.db import connection

from core.grouping import GroupRunner


def run_in_turn(
    group: GroupRunner, entered: threading.Event, release: threading.Event, calls: list[Callable[[], object]]
) -> list[object]:
    """Start `calls[0]` in a thread and wait until its batch is `entered` (and held there); start
    each other call in its own thread once the one before it is seen waiting in `group`; then set
    `release`. Returns what each call returned, or the exception it raised, in order. Each thread
    closes its database connection at the end, as a request thread's would be."""
    got: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            got[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            got[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(0,))]
    threads[0].start()
    assert entered.wait(10)
    for i in range(1, len(calls)):
        threads.append(threading.Thread(target=run, args=(i,)))
        threads[-1].start()
        deadline = time.monotonic() + 10
        while len(group._waiting) < i and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(group._waiting) == i
    release.set()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads)
    return got
