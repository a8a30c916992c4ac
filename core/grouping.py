"""Concurrent requests of one process sharing one statement (group commit, in the web process).

A statement that stores one small thing costs mostly the same whatever the number of things it is
given: a round trip, the statement's start, a commit and its WAL flush. So a web process's request
threads share it, as a database shares a WAL flush between concurrent commits, with no timer and no
added wait:

- a request whose group nobody is running runs at once, alone (the *leader*);
- requests that arrive while a statement runs queue up; when it ends, the leader hands over to the
  first of them, which runs every queued request of the same group key together (up to
  `max_items` items), and so on;
- each request gets its batch's outcome, and where its own items sit in the batch: the result, or
  the exception (every request of the batch raises it; nothing of the batch was stored, since the
  batch was one statement).

Used by receipts (receipts.grouping: a provider's receipts) and by the API's single creates
(notifications.api.hot: a tenant's notifications). `run` is called on the leader's thread, so on its
database connection, which must not be inside a transaction of its own: callers run alone there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

C = TypeVar("C")  # what a batch is run for (the leader's: a provider view, a tenant)
T = TypeVar("T")  # an item
R = TypeVar("R")  # a batch's result


class BatchInterrupted(RuntimeError):
    """The thread running a batch was stopped (its own request's exception was not an Exception)."""


@dataclass(eq=False, slots=True)
class _Request:
    context: Any
    key: Hashable
    items: Sequence[Any]
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to run the next batch rather than with an outcome
    start: int = 0  # where this request's items begin in its batch
    result: Any = None
    error: BaseException | None = None


class GroupRunner(Generic[C, T, R]):
    """`submit(context, items)` runs `run(context, items)`, sharing calls between threads whose
    contexts have the same `key(context)` (module docstring)."""

    def __init__(self, run: Callable[[C, list[T]], R], *, key: Callable[[C], Hashable], max_items: int) -> None:
        self._run = run
        self._key = key
        self.max_items = max_items
        self._lock = threading.Lock()
        self._waiting: list[_Request] = []
        self._busy = False

    def submit(self, context: C, items: Sequence[T]) -> tuple[R, int]:
        """The result of the batch that held `items`, and the index of the first of them in it."""
        request = _Request(context, self._key(context), items)
        with self._lock:
            self._waiting.append(request)
            lead = not self._busy
            self._busy = True
        while not lead:
            request.done.wait()
            if not request.lead:
                break
            request.done.clear()
            lead, request.lead = True, False
        if lead:
            self._run_batch()
            request.done.wait()  # set by the batch that held this request (this leader's own, or one before it)
        if request.error is not None:
            raise request.error
        return request.result, request.start

    def _run_batch(self) -> None:
        """Take the waiting requests of the first one's key, run them in one call, hand over to the
        next waiting request (or go idle), then give the batch its outcome."""
        with self._lock:
            batch, rest, count = [], [], 0
            for waiting in self._waiting:
                fits = not batch or (waiting.key == batch[0].key and count + len(waiting.items) <= self.max_items)
                if fits:
                    waiting.start = count
                    count += len(waiting.items)
                (batch if fits else rest).append(waiting)
            self._waiting = rest
        result: Any = None
        error: BaseException | None = None
        try:
            result = self._run(batch[0].context, [item for request in batch for item in request.items])
        except Exception as exc:  # noqa: BLE001 - every request of the batch answers it
            error = exc
        except BaseException:  # this thread is being stopped: the others answer an error and go on
            error = BatchInterrupted("the statement of this batch was interrupted; retry")
            raise
        finally:
            with self._lock:
                if self._waiting:
                    successor = self._waiting[0]
                    successor.lead = True
                    successor.done.set()
                else:
                    self._busy = False
            for request in batch:
                request.result, request.error = result, error
                request.done.set()
