"""When a notification's channel fallback is due, and when it is cancelled: a table of decisions, read
by a pure function and written out as the SQL the statements that learn the reasons carry out.

- From the original's outcome (the dispatcher's record statement): `delivered` (the provider accepted
  it) makes the fallback due `after_seconds` later; `failed` and `dead_lettered` make it due now;
  `suppressed` cancels it. Any other outcome (a retry) decides nothing yet.
- From a receipt on the original (the receipts statement): `bounced`, `undelivered` and `failed` make
  the fallback due now; `delivered` and `complained` cancel it (the first channel got through).

Cancelling the original cancels its fallback too (notifications.fallback.cancel_with), and one
suppressed at creation takes its fallback with it (notifications.services): those need no table.
Which rows the decisions change, and how, is notifications.fallback's (the fallback is a
notification); tests/routing/test_fallback_table.py runs `decision_sql` over the same cases as
`decide` and compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Decision:
    cancel: bool = False  # the fallback is cancelled; else it is due
    after: bool = False  # due `after_seconds` after now; else due now


DUE_NOW, DUE_AFTER, CANCEL = Decision(), Decision(after=True), Decision(cancel=True)

# What an outcome of the original decides (its status as the record statement leaves it).
ON_OUTCOME: dict[str, Decision] = {
    "delivered": DUE_AFTER, "failed": DUE_NOW, "dead_lettered": DUE_NOW, "suppressed": CANCEL,
}  # fmt: skip
# What a receipt on the original decides (the receipt the receipts statement raised it to).
ON_RECEIPT: dict[str, Decision] = {
    "bounced": DUE_NOW, "undelivered": DUE_NOW, "failed": DUE_NOW, "delivered": CANCEL, "complained": CANCEL,
}  # fmt: skip


def decide(table: dict[str, Decision], value: str | None) -> Decision | None:
    """The decision `value` (an outcome or a receipt) makes by `table`; None: none yet."""
    return table.get(value) if value is not None else None


def delay_seconds(decision: Decision, after_seconds: float | None) -> float:
    """How long after now a fallback the decision makes due is due (a missing step's after_seconds: 0)."""
    return float(after_seconds or 0) if decision.after else 0.0


def _quoted(values: list[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def decision_sql(table: dict[str, Decision], value: str, after_seconds: str) -> tuple[str, str, str]:
    """SQL of `decide` and `delay_seconds` over the column expressions `value` and `after_seconds`:
    (whether it decides anything, whether it cancels, the delay in seconds)."""
    decided = f"{value} IN ({_quoted(list(table))})"
    cancelling = [v for v, d in table.items() if d.cancel]
    cancels = f"{value} IN ({_quoted(cancelling)})" if cancelling else "false"
    later = [v for v, d in table.items() if d.after]
    delay = (
        f"CASE WHEN {value} IN ({_quoted(later)}) THEN coalesce({after_seconds}, 0)::float8 ELSE 0::float8 END"
        if later else "0::float8"
    )  # fmt: skip
    return decided, cancels, delay
