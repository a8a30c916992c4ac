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
across it and `AFTER_APPLY` once for it, exactly as a vendor's own batch of several events. The
batching itself is core.grouping's, shared with the API's single creates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core.grouping import BatchInterrupted, GroupRunner
from receipts.inbound import ProviderView, Receipt
from receipts.services import ApplyResult, apply_receipts

__all__ = ["BatchInterrupted", "GroupApply", "apply_grouped"]

MAX_ROWS = 1000  # receipts in one statement (a SendGrid batch of more goes alone)

Apply = Callable[[ProviderView, list[Receipt]], ApplyResult]


def _view_key(view: ProviderView) -> tuple[int, object]:
    return view.id, view.updated_at  # a provider edited since is not applied with the older view's receipts


class GroupApply(GroupRunner[ProviderView, Receipt, ApplyResult]):
    """`apply(view, receipts)` as `apply_receipts`, sharing statements between threads (core.grouping)."""

    def __init__(self, apply: Apply = apply_receipts, *, max_rows: int = MAX_ROWS) -> None:
        super().__init__(apply, key=_view_key, max_items=max_rows)

    def apply(self, view: ProviderView, receipts: Sequence[Receipt]) -> ApplyResult:
        return self.submit(view, receipts)[0]


_GROUP = GroupApply()


def apply_grouped(view: ProviderView, receipts: Sequence[Receipt]) -> ApplyResult:
    """`apply_receipts` for a request thread: shares the statement with this process's concurrent requests."""
    return _GROUP.apply(view, receipts)
