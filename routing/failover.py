"""Which provider each claimed item goes through: failover order and circuit breakers.

A notification that names its provider (`provider_named`) always goes through it. One that does not
moves along its channel's `failover_order` (the tenant's providers of that channel that have one):
a transient failure sends its next try to the next provider in the order (`next_after`, written by
the record statement into the queue item), and at claim time a provider whose breaker is open, or
half-open with no probe left, is skipped for the next one that can take it. Skipping costs no
attempt; when no provider of the order can take it, the item is given back with the usual backoff.

The breakers are read from memory: `refresh()` (on the DB thread, at most every REFRESH_SECONDS) reads
the failover orders and every breaker that is not closed (one small statement, however busy the
dispatcher is), and `learn()` takes the states each record statement returns for the providers of
its batch, so a breaker that opens (this dispatcher's record or a peer's) is routed around from the
next claim on. Only a half-open breaker costs a statement at claim time: its probes are reserved in
its row (`circuits.reserve_probes`), so all dispatchers together let at most `circuits.PROBES` through.
A pinned notification whose provider is open waits (with the backoff) rather than fail over.

Failing over keeps to the rate limits: an item routed at claim time to a rate-limited provider
(its own or its tenant's `rate_per_second`) is not sent by this claim, which did not take that
provider's tokens; it goes back at once, untried, into that provider's lane (`Routed.relane`; the
record statement's settle re-decides `rate_limited` for a changed provider, as for a retry's).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from providers.circuit import CLOSED, HALF_OPEN
from routing import circuits

REFRESH_SECONDS = 0.5


class _Lease(Protocol):
    provider_id: int | None  # the provider the item goes through; routing may change it


class Routable(Protocol):
    """What routing reads of a claimed item (the dispatcher's dispatch.delivery.Prepared)."""

    lease: _Lease
    provider_named: bool  # the client named the provider: it never fails over
    tenant_key: str
    channel: str


Item = TypeVar("Item", bound=Routable)


@dataclass
class Routed(Generic[Item]):
    send: list[Item] = field(default_factory=list)
    wait: list[Item] = field(default_factory=list)  # every provider of the order is open: back, untried
    # failed over to a rate-limited provider (lease.provider_id is the new one): back into its lane, untried
    relane: list[Item] = field(default_factory=list)


class Router:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.orders: dict[tuple[str, str], list[int]] = {}  # (tenant id, channel) → provider ids in order
        self.position: dict[int, tuple[str, str]] = {}  # provider id → its order's key
        self.states: dict[int, str] = {}  # breakers not closed
        self.limited: set[int] = set()  # providers of an order that are rate-limited (theirs or their tenant's)
        self._refreshed = -1e9

    def refresh(self, force: bool = False) -> None:
        """On the DB thread: the failover orders and the breakers that are not closed."""
        now = self.clock()
        if not force and now - self._refreshed < REFRESH_SECONDS:
            return
        ordered, self.states = circuits.routing_snapshot()
        orders: dict[tuple[str, str], list[int]] = {}
        for pk, tenant_id, channel, _ in ordered:
            orders.setdefault((tenant_id, channel), []).append(pk)
        self.orders = orders
        self.limited = {pk for pk, _, _, limited in ordered if limited}
        self.position = {pk: key for key, ids in orders.items() for pk in ids}
        self._refreshed = now

    def fresh(self) -> bool:
        """Whether the last refresh is recent enough that route() may go by it without another."""
        return self.clock() - self._refreshed < REFRESH_SECONDS

    def learn(self, states: dict[int, str]) -> None:
        """Breaker states a record statement just read or wrote (circuits.RECORDED_STATES): the next
        route() goes by them, without waiting for the next refresh."""
        if not states:
            return
        known = dict(self.states)
        for pk, state in states.items():
            if state == CLOSED:
                known.pop(pk, None)
            else:
                known[pk] = state
        self.states = known  # replaced whole: route() on the DB thread reads one dict or the other

    def order_of(self, item: Routable) -> list[int]:
        """The providers the item may go through, starting with its current one."""
        current = item.lease.provider_id
        if item.provider_named or current is None:
            return [current] if current is not None else []
        key = self.position.get(current)
        if key is None or key != (item.tenant_key, item.channel):
            return [current]  # its provider is not in an order (or not this tenant's): it stays there
        ids = self.orders[key]
        start = ids.index(current)
        return ids[start:] + ids[:start]

    def next_after(self, item: Routable) -> int | None:
        """The provider a transient failure sends the item's next try to (None: the same one)."""
        order = self.order_of(item)
        return order[1] if len(order) > 1 else None

    def route(self, items: list[Item], reserve: Callable[[dict[int, int]], dict[int, int]]) -> Routed[Item]:
        """Choose each item's provider (changing `item.lease.provider_id`); `reserve` takes probe sends
        of half-open breakers ({provider: wanted} → granted), called once, only if one is half-open."""
        routed: Routed[Item] = Routed()
        if not self.states:  # every breaker closed: nothing to decide
            routed.send = items
            return routed
        # An item whose current provider's breaker is closed stays on it (its order starts there).
        undecided = []
        for item in items:
            current = item.lease.provider_id
            if current is not None and current not in self.states:
                routed.send.append(item)
            else:
                undecided.append(item)
        if not undecided:
            return routed
        items = undecided
        wanted: dict[int, int] = {}
        for item in items:
            for pid in self.order_of(item):
                if self.states.get(pid) == HALF_OPEN:
                    wanted[pid] = wanted.get(pid, 0) + 1
                    break
                if pid not in self.states:
                    break
        probes = reserve(wanted) if wanted else {}
        for item in items:
            chosen = None
            for pid in self.order_of(item):
                state = self.states.get(pid)
                if state is None:
                    chosen = pid
                    break
                if state == HALF_OPEN and probes.get(pid, 0) > 0:
                    probes[pid] -= 1
                    chosen = pid
                    break
            if chosen is None:
                routed.wait.append(item)
                continue
            moved = chosen != item.lease.provider_id
            item.lease.provider_id = chosen
            (routed.relane if moved and chosen in self.limited else routed.send).append(item)
        return routed
