"""A provider's circuit breaker as a pure function: from its row, the batch being recorded, the
provider's counters, its settings and the clock, the breaker's next row.

This is the rule; the record statement carries it out in SQL on the database's clock
(routing.circuits, `transition_ctes` and `NEXT_ROW`), and tests/routing/test_breaker_table.py runs
that SQL over the same table of cases as this function and compares the two.

- The window's counts are the provider's counters (attempts less those answered 429, and of those
  the transient failures), cumulative: the row keeps their totals at the window's start (`base_*`)
  and the previous window's counts (`prev_*`). A window that has run its `window_seconds` rolls: the
  counts before this batch become the new base, and what the ended window counted its `prev_*` (if
  it ended less than a window ago; else nothing).
- The estimate is sliding: `prev · (1 − elapsed / window) + current`, for requests and failures.
- Closed, it opens when the estimate has at least `min_requests` requests, a failure, and failures
  at least `failure_threshold` of the requests. Open, it stays open until `opened_at + open_seconds`:
  from then on it reads half-open (not stored, `state_of`); there one failure of the batch re-opens
  it, else one success closes it (and the window restarts from the counters as they are now).
- Only a batch with a transient failure, or a breaker that is not closed, is considered; any other
  leaves the row as it is (`keep`), which is also the answer when nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from providers.circuit import CLOSED, HALF_OPEN, OPEN

KEEP, OPEN_STEP, REOPEN, CLOSE, ROLL = "keep", "open", "reopen", "close", "roll"


@dataclass(frozen=True, slots=True)
class Settings:
    """A provider's `circuit` settings, defaults filled in (providers.circuit.settings_of)."""

    failure_threshold: float
    min_requests: float
    window_seconds: float
    open_seconds: float


@dataclass(frozen=True, slots=True)
class Row:
    """A `provider_circuits` row: `state` closed or open (half-open is read, never stored)."""

    state: str = CLOSED
    opened_at: datetime | None = None
    window_started_at: datetime | None = None
    base_requests: int = 0
    base_failures: int = 0
    prev_requests: int = 0
    prev_failures: int = 0


@dataclass(frozen=True, slots=True)
class Batch:
    """What the batch being recorded did through the provider, 429s left out."""

    sends: int
    failures: int  # transient
    successes: int


def state_of(row: Row | None, open_seconds: float, now: datetime) -> str:
    """closed | open | half_open of a breaker (closed without a row)."""
    if row is None or row.state != OPEN:
        return CLOSED
    return HALF_OPEN if now >= row.opened_at + timedelta(seconds=open_seconds) else OPEN


def considered(row: Row | None, batch: Batch) -> bool:
    """Whether the record statement looks at the breaker at all: a transient failure in the batch,
    or a breaker that is not closed."""
    return batch.failures > 0 or (row is not None and row.state == OPEN)


def transition(
    row: Row | None, batch: Batch, counted: tuple[int, int], settings: Settings, now: datetime
) -> tuple[str, Row | None]:
    """The step (keep | open | reopen | close | roll) and the row it writes (None for keep).
    `counted`: the provider's (requests, failures) in the counters before this batch."""
    if not considered(row, batch):
        return KEEP, None
    has_row = row is not None
    current = row or Row()
    total_requests, total_failures = counted[0] + batch.sends, counted[1] + batch.failures
    half_open = has_row and state_of(row, settings.open_seconds, now) == HALF_OPEN
    window = timedelta(seconds=settings.window_seconds)
    started = current.window_started_at
    rolled = not has_row or started is None or now >= started + window
    if rolled:
        base = (total_requests - batch.sends, total_failures - batch.failures)
        recent = has_row and started is not None and now < started + 2 * window  # what the ended window counted
        prev = (base[0] - current.base_requests, base[1] - current.base_failures) if recent else (0, 0)
        started = now
    else:
        base = (current.base_requests, current.base_failures)
        prev = (current.prev_requests, current.prev_failures)
    share = max(0.0, 1.0 - (now - started).total_seconds() / settings.window_seconds)
    requests = share * prev[0] + (total_requests - base[0])
    failures = share * prev[1] + (total_failures - base[1])
    if half_open and batch.failures > 0:
        step = REOPEN
    elif half_open and batch.successes > 0:
        step = CLOSE
    elif current.state == OPEN:
        step = KEEP
    elif requests >= settings.min_requests and failures > 0 and failures >= settings.failure_threshold * requests:
        step = OPEN_STEP
    elif rolled:
        step = ROLL
    else:
        step = KEEP
    if step == KEEP:
        return KEEP, None
    if step == CLOSE:
        return CLOSE, Row(CLOSED, None, now, total_requests, total_failures, 0, 0)
    moved = Row(current.state, current.opened_at, started, base[0], base[1], prev[0], prev[1])
    return step, replace(moved, state=OPEN, opened_at=now) if step in (OPEN_STEP, REOPEN) else moved
