"""One claim of the dispatcher, on its DB thread: stage due items, take tokens for rate-limited
lanes, claim (one statement), read the claimed items' providers. A fixed number of statements
per batch; the lane arithmetic is dispatch.policy's.

A ring is claimed on the doorbell thread as well, on the LISTEN connection (`claim_rung`), while the
fetch loop sleeps or waits on the DB thread: that connection's server process is awake the moment the ring arrives,
and neither the event loop nor the DB thread has to wake before the claim. The same fair claim, with
no lanes (the fetch loop takes those) and no starvation scan (the fetch loop looks once a second);
what follows the claim (suppressions, routing, providers) is done from memory when nothing needs
the database (`sort_in_memory`), else on the DB thread (`sort`). One lock keeps the two threads'
claims apart. Only on a direct connection: behind a pooler the LISTEN connection is
OMNIPOST_LISTEN_DATABASE_URL's, which carries LISTEN only."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

from core import pooling
from core.db_faults import is_connection_lost, reset_connection
from dispatch import policy
from dispatch.delivery import (
    ClaimSeen,
    DispatchLease,
    Prepared,
    claim_and_start,
    prepare_when_asked,
    push_targets,
    suppressed_among,
)
from dispatch.providers import ProviderCache
from providers.models import Provider
from queueing import queue, ratelimit
from queueing.models import LEASED, QueueItem
from routing import circuits
from routing.failover import Router

logger = logging.getLogger("omnipost.dispatcher")

PROVIDER_CACHE_SECONDS = 5.0  # how often a claim asks whether any ready item waits for a lane
LANE_REFRESH_SECONDS = 0.25
STARVATION_CHECK_SECONDS = 1.0  # how often a claim also looks for items past the starvation threshold

@dataclass(slots=True)
class ClaimResult:
    """What one claim hands the dispatcher: each item in exactly one list, handed out once."""

    send: list[Prepared] = field(default_factory=list)  # sendable now, through the provider routing chose
    # leased but not sendable any more (cancelled, delivered, failed meanwhile): acked, never sent
    skipped: list[DispatchLease] = field(default_factory=list)
    # the recipient is suppressed now (the claim's suppression check): recorded `suppressed`, unsent
    suppressed: list[DispatchLease] = field(default_factory=list)
    # no provider of their failover order can take them now (breakers open): back with the backoff, untried
    waiting: list[Prepared] = field(default_factory=list)
    # failed over to a rate-limited provider: back at once into its lane, untried
    relaned: list[Prepared] = field(default_factory=list)
    # claimed, but the session was lost before their providers were read: given back, untried
    unready: list[Prepared] = field(default_factory=list)
    next_token_in: float | None = None  # when the next token of a dry rate-limited lane is due


def can_claim_on_listen_connection() -> bool:
    """Whether the LISTEN connection is a direct one to the database that may claim: not behind a
    pooler, where it is OMNIPOST_LISTEN_DATABASE_URL's and carries LISTEN only (core.pooling)."""
    return not pooling.pooled() and not getattr(settings, "OMNIPOST_LISTEN_DATABASE_URL", "")


def queue_has_rate_limited_items() -> bool:
    """Whether any ready item not in flight waits for a lane (one probe of queue_state_lane_idx)."""
    return QueueItem.objects.filter(ready=True, rate_limited=True).exclude(LEASED).exists()


def ready_lanes(queues: list[str] | None) -> dict[int, ratelimit.LaneSpec]:
    """Every provider with ready rate-limited items, with its limits as they are now (two queries).

    Whatever the items' flag says: a provider whose limit (or its tenant's) was removed gets a lane
    with no keys, whose grant is all that is asked, so its items are never stranded while
    `queue.sync_rate_limited` catches up (or if a flag was set by an enqueue that raced the change).
    """
    provider_ids = queue.rate_limited_providers(queues)
    if not provider_ids:
        return {}
    rows = Provider.objects.filter(pk__in=provider_ids).values_list(
        "pk", "tenant_id", "rate_per_second", "burst", "tenant__rate_per_second", "tenant__rate_burst"
    )
    return {
        pid: ratelimit.LaneSpec(pid, tid, prate, pburst, trate, tburst)
        for pid, tid, prate, pburst, trate, tburst in rows
    }


def throttle_devices(prepared: list[Prepared], limited: Callable[[int], bool]) -> None:
    """Rate limits of the providers a push's devices go through besides the item's own (whose lane the
    claim took the item's token from): one token of each such provider, or its tenant's, per device
    send (a query of their limits and one take, only when devices of a provider `limited` says is
    rate-limited, as the provider cache read it, are claimed); a device its
    provider has no token for now is not sent this try (`Target.throttled`: pending, retried when
    the provider's next token is due), as a device past an open breaker is held."""
    wanted: dict[int, list] = {}
    for item in prepared:
        for target in item.targets or ():
            if (target.active and not target.held and target.provider_id != item.lease.provider_id
                    and limited(target.provider_id)):
                wanted.setdefault(target.provider_id, []).append(target)
    if not wanted:
        return
    rows = Provider.objects.filter(pk__in=list(wanted)).values_list(
        "pk", "tenant_id", "rate_per_second", "burst", "tenant__rate_per_second", "tenant__rate_burst"
    )
    lanes = {pid: ratelimit.LaneSpec(pid, tid, prate, pburst, trate, tburst)
             for pid, tid, prate, pburst, trate, tburst in rows if prate is not None or trate is not None}  # fmt: skip
    if not lanes:
        return
    grant = ratelimit.take(lanes, {pid: len(wanted[pid]) for pid in lanes})
    for pid in lanes:
        for target in wanted[pid][grant.granted.get(pid, 0) :]:
            target.throttled = grant.next_token_in or 1.0


class Claimer:
    def __init__(
        self, queues: list[str] | None, lease_seconds: float, providers: ProviderCache,
        clock: Callable[[], float] = time.monotonic, router: Router | None = None,
    ) -> None:  # fmt: skip
        self.queues = queues
        self.lease_seconds = lease_seconds
        self.providers = providers
        self.clock = clock
        self.lanes: dict[int, ratelimit.LaneSpec] = {}
        self._lanes_checked = self._starving_checked = self._any_limits_checked = self._staged_at = -1e9
        self.any_limits = False
        self.orphans: list[uuid.UUID] = []  # tokens of claims that may have committed unseen
        self.router = router or Router(clock)
        # One claim at a time, from the DB thread (`claim`) or the doorbell thread (`claim_rung`); it
        # also guards `orphans`, which both may add to.
        self.lock = threading.Lock()

    def claim(
        self, want: int | Callable[[], int], leave_out: frozenset[str] = frozenset(), stage: bool = True
    ) -> ClaimResult:
        """Claim up to `want` items and sort them (ClaimResult): those whose recipient is suppressed
        now (one statement, only where the claim saw a suppression of their tenant or a category
        other than `general`), then the others' providers chosen (routing.failover: failover order,
        breakers) and read (their versions came with the claim). If the session is lost after the
        claim, what was claimed and not yet sorted comes back as `unready`, to give back. With
        `leave_out` (tenant ids), a claim for the dispatcher's spare slots: only the other tenants'
        unlimited items, nothing staged, no lane's tokens taken. `stage=False`: the caller stages
        (`stage_due`) after the claim's sends have started, off the path from a ring to a send.
        `want` may be a function, asked once the lock is held (the slots a claim on the doorbell
        thread left)."""
        with self.lock:
            if callable(want):
                want = want()
            if want <= 0:
                return ClaimResult()
            if self.orphans:  # claims whose answer a lost session swallowed: give back what they leased
                released = queue.release_claim(self.orphans)
                if released:
                    logger.warning("gave back %d items leased by a claim whose session was lost", released)
                self.orphans.clear()
            seen = ClaimSeen()
            prepared, skipped, next_token_in = self._claim(want, leave_out, seen, stage)
        result = self.sort(prepared, seen)
        result.skipped, result.next_token_in = skipped, (next_token_in if not result.unready else None)
        return result

    def claim_rung(
        self, conn: object, want: int | Callable[[], int]
    ) -> tuple[list[Prepared], list[DispatchLease], ClaimSeen] | None:
        """On the doorbell thread, with the LISTEN connection `conn` (see the module's docstring):
        claim up to `want` items for a ring (a function: asked once the lock is held, as `claim`'s).
        None, claiming nothing, when a claim is under way on the DB thread, when rate-limited lanes
        may hold work or a lost claim awaits its give-back (the fetch loop's), or when `want` is 0. A
        failed claim may have committed: its token goes to `orphans`."""
        if self.any_limits or not self.lock.acquire(blocking=False):
            return None
        try:
            if self.orphans:
                return None
            if callable(want):
                want = want()
            if want <= 0:
                return None
            prepare_when_asked(conn)  # planned once, as on the DB thread
            seen, token = ClaimSeen(), uuid.uuid4()
            try:
                prepared, skipped = claim_and_start(
                    want, lease_seconds=self.lease_seconds, queues=self.queues, look_for_starving=False,
                    raw_connection=conn, token=token, seen=seen,
                )  # fmt: skip
            except Exception:
                self.orphans.append(token)
                raise
            return prepared, skipped, seen
        finally:
            self.lock.release()

    def sort_in_memory(self, prepared: list[Prepared], seen: ClaimSeen) -> ClaimResult | None:
        """On the event loop, for a claim made on the doorbell thread: `sort`'s result when it needs no
        statement (no suppression to look for, routing fresh with every breaker closed, no push, every
        provider cached as the claim read it), else None."""
        if seen.check_suppressions or not self.router.fresh() or self.router.states:
            return None
        entries = self.providers.entries
        for item in prepared:
            pid = item.provider_id
            if item.channel == "push" or (cached := entries.get(pid)) is None:  # type: ignore[arg-type]
                return None
            if seen.versions.get(pid) != cached.row_updated_at:  # type: ignore[arg-type]
                return None
        return ClaimResult(send=prepared)

    def sort(self, prepared: list[Prepared], seen: ClaimSeen) -> ClaimResult:
        """On the DB thread, after a claim: the items whose recipient is suppressed now, the others'
        providers chosen (routing) and loaded. A session lost meanwhile: all of them `unready`."""
        result = ClaimResult()
        try:
            # one statement: the suppression list as it is now (none where the claim saw nothing to find)
            blocked = suppressed_among(prepared) if seen.check_suppressions else set()
            if blocked:
                result.suppressed = [p.lease for i, p in enumerate(prepared) if i in blocked]
                prepared = [p for i, p in enumerate(prepared) if i not in blocked]
            if prepared:  # which provider each goes through (failover order, breakers): routing.failover
                self.router.refresh()
                routed = self.router.route(prepared, circuits.reserve_probes)
                prepared, result.waiting, result.relaned = routed.send, routed.wait, routed.relane
            # a push to devices goes through a provider of each device's kind (one statement for the
            # pushes), each device routed along its kind's failover order past open breakers
            devices = push_targets(prepared)
            if devices:
                self.router.route_devices(prepared)
                devices = {t.provider_id for p in prepared if p.targets for t in p.targets if t.active and not t.held}
            self.providers.load({p.provider_id for p in prepared} | devices, known=seen.versions)
            if devices:
                throttle_devices(prepared, self.providers.limited)
        except Exception as exc:
            if not is_connection_lost(exc):
                raise
            reset_connection()
            logger.warning("database lost after a claim; giving back %d items", len(prepared))
            result.unready = prepared
            return result
        result.send = prepared
        return result

    def _claim(
        self, want: int, leave_out: frozenset[str], seen: ClaimSeen, stage: bool
    ) -> tuple[list[Prepared], list[DispatchLease], float | None]:
        if leave_out:
            lanes, main, next_token_in, look_for_starving = {}, want, None, False
        else:
            if stage:
                self.stage_due()
            granted, next_token_in = self._grant_lanes(want)
            lanes, main = policy.split_claim(want, granted)
            now = self.clock()
            look_for_starving = now - self._starving_checked >= STARVATION_CHECK_SECONDS
            if look_for_starving:
                self._starving_checked = now
        token = uuid.uuid4()
        try:
            prepared, skipped = claim_and_start(
                main, lease_seconds=self.lease_seconds, queues=self.queues, lanes=lanes,
                look_for_starving=look_for_starving, token=token, leave_out=sorted(leave_out), seen=seen,
            )  # fmt: skip
        except Exception:
            self.orphans.append(token)  # it may have committed: given back by the next claim
            raise
        if lanes:
            claimed = [(p.lease.provider_id, p.lease.rate_limited) for p in prepared]
            unused = policy.unused_grants(lanes, claimed + [(s.provider_id, s.rate_limited) for s in skipped])
            ratelimit.give_back(self.lanes, unused)
            for pid, n in unused.items():
                if n > 0:  # the lane ran dry: look again at the next refresh, not every batch
                    self.lanes.pop(pid, None)
        return prepared, skipped, next_token_in

    def stage_is_due(self) -> bool:
        return self.clock() - self._staged_at >= queue.STAGE_SECONDS

    def stage_due(self) -> int:
        """Bring due retries and delayed enqueues back into the ready set, at most every STAGE_SECONDS
        (sooner while a full batch was staged: a backlog of them came due at once); how many came."""
        now = self.clock()
        if now - self._staged_at < queue.STAGE_SECONDS:
            return 0
        staged = queue.stage()
        self._staged_at = -1e9 if staged.count >= queue.STAGE_LIMIT else now
        if staged.rate_limited:  # their lanes may have been dropped as dry: look again now
            self._any_limits_checked = self._lanes_checked = -1e9
        return staged.count

    def _grant_lanes(self, want: int) -> tuple[dict[int, int], float | None]:
        now = self.clock()
        if now - self._any_limits_checked > PROVIDER_CACHE_SECONDS:
            self.any_limits = queue_has_rate_limited_items()
            self._any_limits_checked = now
        if not self.any_limits:
            return {}, None
        if now - self._lanes_checked > LANE_REFRESH_SECONDS:
            self.lanes = ready_lanes(self.queues)
            self._lanes_checked = now
            self.any_limits = bool(self.lanes) or queue_has_rate_limited_items()
        if not self.lanes:
            return {}, None
        grant = ratelimit.take(self.lanes, policy.lane_asks(self.lanes, want))
        return dict(grant.granted), grant.next_token_in
