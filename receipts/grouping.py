"""Receipts of concurrent requests applied together: one apply statement for all that are waiting.

A receipt request is one small signed event, and `apply_receipts` costs mostly the same whatever
the number of receipts it is given: in process, against PostgreSQL 15 on this project's 2-core
machine, 1 receipt a call took ≈ 400–500 µs of PostgreSQL CPU and ≈ 250–330 µs of Python per receipt,
4 a call ≈ 135–165 and ≈ 70–105 µs, 8 a call ≈ 75–85 and ≈ 45 µs (bench/receipts_bench.py's
receipts, 2,000 each). So the web process's threads share the statement, as a database shares
a WAL flush (group commit), with no timer and no added wait:

- a request whose provider nobody is applying for runs at once, alone (the *leader*);
- requests that arrive while a statement runs queue up; when it ends, the leader hands over to the
  first of them, which applies every queued request of the same provider view together (up to
  MAX_ROWS receipts), and so on;
- each request gets its batch's outcome: `stale` (the provider changed; it re-reads and tries
  again, as alone) or an exception (every request of the batch answers it, 500 or 503; the vendor
  retries and de-duplication makes the retry safe).

Receipts of one batch are one `apply_receipts` call: de-duplication by key within it, precedence
across it and `AFTER_APPLY` once for it, exactly as a vendor's own batch of several events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from receipts.inbound import ProviderView, Receipt
from receipts.services import ApplyResult, apply_receipts

MAX_ROWS = 1000  # receipts in one statement (a SendGrid batch of more goes alone)

Apply = Callable[[ProviderView, list[Receipt]], ApplyResult]


class BatchInterrupted(RuntimeError):
    """The thread applying a batch was stopped (its own request's exception was not an Exception)."""


@dataclass(eq=False, slots=True)
class _Request:
    view: ProviderView
    receipts: Sequence[Receipt]
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to apply the next batch rather than with an outcome
    result: ApplyResult | None = None
    error: BaseException | None = None

    @property
    def key(self) -> tuple[int, object]:
        return self.view.id, self.view.updated_at


class GroupApply:
    """`apply(view, receipts)` as `apply_receipts`, sharing statements between threads (module docstring)."""

    def __init__(self, apply: Apply = apply_receipts, *, max_rows: int = MAX_ROWS) -> None:
        self._apply = apply
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._waiting: list[_Request] = []
        self._busy = False

    def apply(self, view: ProviderView, receipts: Sequence[Receipt]) -> ApplyResult:
        request = _Request(view, receipts)
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
        assert request.result is not None
        return request.result

    def _run_batch(self) -> None:
        """Take the waiting requests of the first one's provider view, apply them in one call, hand
        over to the next waiting request (or go idle), then give the batch its outcome."""
        with self._lock:
            batch, rest, rows = [], [], 0
            for waiting in self._waiting:
                fits = not batch or (waiting.key == batch[0].key and rows + len(waiting.receipts) <= self.max_rows)
                (batch if fits else rest).append(waiting)
                rows += len(waiting.receipts) if fits else 0
            self._waiting = rest
        result: ApplyResult | None = None
        error: BaseException | None = None
        try:
            result = self._apply(batch[0].view, [r for request in batch for r in request.receipts])
        except Exception as exc:  # noqa: BLE001 - every request of the batch answers it
            error = exc
        except BaseException:  # this thread is being stopped: the others answer an error and go on
            error = BatchInterrupted("the statement applying these receipts was interrupted; retry")
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


_GROUP = GroupApply()


def apply_grouped(view: ProviderView, receipts: Sequence[Receipt]) -> ApplyResult:
    """`apply_receipts` for a request thread: shares the statement with this process's concurrent requests."""
    return _GROUP.apply(view, receipts)
