"""Which receipt a notification shows when several arrive: a pure function.

Receipts arrive in any order and more than once, so the notification shows the *highest-ranked*
receipt reported so far, never simply the latest:

    delivered < undelivered < failed < bounced (type unknown) < bounced soft < bounced hard < complained

A later `delivered` therefore never hides an earlier `bounced`; a hard bounce outranks a soft one (an
address that bounced hard is gone, whatever a retry said before); a complaint outranks everything
(the recipient got it and reported it). Because the result is a maximum over a total order, it does
not depend on the order the receipts arrive in, and concurrent writers converge: each update is
conditional on raising the rank (`receipts.services`, which asks PostgreSQL the same question with
`array_position(ORDER, key)`).
"""

from __future__ import annotations

from collections.abc import Iterable

ORDER = ("delivered", "undelivered", "failed", "bounced", "bounced:soft", "bounced:hard", "complained")


def key(receipt: str | None, bounce_type: str | None = None) -> str | None:
    """The rank key: `receipt`, with `:bounce_type` for a typed bounce; None for no receipt."""
    if receipt is None:
        return None
    return f"{receipt}:{bounce_type}" if receipt == "bounced" and bounce_type else receipt


def rank(receipt: str | None, bounce_type: str | None = None) -> int:
    """0 for no receipt, then 1… in ORDER."""
    k = key(receipt, bounce_type)
    return 0 if k is None else ORDER.index(k) + 1


def outranks(new: tuple[str | None, str | None], current: tuple[str | None, str | None]) -> bool:
    """Whether receipt `new` (receipt, bounce_type) replaces `current` on the notification."""
    return rank(*new) > rank(*current)


def settle(current: tuple[str | None, str | None], reported: Iterable[tuple[str | None, str | None]]) -> tuple:
    """What the notification shows after `reported` receipts, starting from `current`."""
    best = current
    for receipt in reported:
        if outranks(receipt, best):
            best = receipt
    return best
