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

A push to a subscriber's devices goes to each device through a provider of the device's kind: the
native push kinds (APNs, FCM, Web Push) fail over within their kind only (an APNs token means nothing
to FCM), each kind in the channel's failover order. Each device is routed past open breakers at claim
time (`route_devices`), and a device that failed transiently is tried next through the next provider
of its kind (`next_for_device`, stored with the device's result).

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
        # (tenant id, channel) → provider ids in order; (tenant id, "channel:kind") for a kind that
        # fails over to its own kind only (circuits.OWN_ORDER_KINDS: the native push kinds)
        self.orders: dict[tuple[str, str], list[int]] = {}
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
        for pk, tenant_id, order, _ in ordered:
            orders.setdefault((tenant_id, order), []).append(pk)
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
        return self._order_from(current, item.tenant_key, item.channel)

    def _order_from(self, current: int, tenant_key: str, channel: str) -> list[int]:
        key = self.position.get(current)
        # `channel`, or `channel:kind` for a kind with an order of its own (circuits.OWN_ORDER_KINDS)
        if key is None or key[0] != tenant_key or key[1].partition(":")[0] != channel:
            return [current]  # its provider is not in an order (or not this tenant's): it stays there
        ids = self.orders[key]
        start = ids.index(current)
        return ids[start:] + ids[:start]

    def next_after(self, item: Routable) -> int | None:
        """The provider a transient failure sends the item's next try to (None: the same one)."""
        order = self.order_of(item)
        return order[1] if len(order) > 1 else None

    def device_order(self, item: Routable, provider_id: int) -> list[int]:
        """The providers a device of a push (`item`) may go through, starting with `provider_id`, the
        one serving it now: the failover order of that provider's kind, unless the client named the
        provider (then that one only)."""
        if item.provider_named:
            return [provider_id]
        return self._order_from(provider_id, item.tenant_key, item.channel)

    def next_for_device(self, item: Routable, provider_id: int) -> int:
        """The provider a device's transient failure on `provider_id` sends its next try to."""
        order = self.device_order(item, provider_id)
        return order[1] if len(order) > 1 else provider_id

    def route_devices(self, items: list[Item]) -> None:
        """Choose the provider of each device a push of `items` goes to now (`Target.provider_id`),
        as `route` does for items: along its kind's failover order from the provider serving it,
        past open breakers. A half-open one takes the device only where it is the provider the item
        itself was routed to (its probe is reserved). A device whose every provider is open is held
        (`Target.held`): not sent this try, still pending, like a transient failure."""
        if not self.states:
            return
        for item in items:
            targets = getattr(item, "targets", None)
            if not targets:
                continue
            for target in targets:
                if not target.active or target.provider_id not in self.states:
                    continue
                chosen = None
                for pid in self.device_order(item, target.provider_id):
                    state = self.states.get(pid)
                    if state is None or (state == HALF_OPEN and pid == item.lease.provider_id):
                        chosen = pid
                        break
                if chosen is None:
                    target.held = True
                else:
                    target.provider_id = chosen

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
