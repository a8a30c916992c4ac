"""Routing decisions (routing.failover) and the breakers' shared state (routing.circuits), in process."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from dispatch.delivery import Attempt, DispatchLease, Outcome, Prepared, Target, claim_and_start, record_outcomes
from notifications.services import NotificationSpec, create_notifications
from routing import circuits
from routing.failover import Router
from routing.models import ProviderCircuit
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def _item(tenant, provider_id: int, *, named: bool = False) -> Prepared:  # noqa: ANN001
    lease = DispatchLease(1, uuid.uuid4(), provider_id, False, str(uuid.uuid4()), str(tenant.pk))
    return Prepared(lease, "webhook", "", "s", "b", {}, datetime.now(UTC), 1, 1, None, provider_named=named)


def _open(provider, *, ago: float = 0.0) -> None:  # noqa: ANN001
    now = timezone.now()
    ProviderCircuit.objects.update_or_create(
        provider=provider, defaults={"state": "open", "opened_at": now - timedelta(seconds=ago), "probes": 0,
                                     "window_started_at": now, "updated_at": now},
    )  # fmt: skip


def test_order_next_provider_and_skipping_open_breakers(tenant_a, tenant_b):
    first = factories.provider(tenant_a, "first", failover_order=0, circuit={"open_seconds": 60})
    second = factories.provider(tenant_a, "second", failover_order=1)
    third = factories.provider(tenant_a, "third", failover_order=2)
    outside = factories.provider(tenant_a, "outside")
    router = Router()
    router.refresh(force=True)
    assert router.next_after(_item(tenant_a, first.pk)) == second.pk
    assert router.next_after(_item(tenant_a, third.pk)) == first.pk  # the order wraps around
    assert router.next_after(_item(tenant_a, first.pk, named=True)) is None  # named: never fails over
    assert router.next_after(_item(tenant_a, outside.pk)) is None  # not in the order
    assert router.next_after(_item(tenant_b, first.pk)) is None  # not this tenant's order

    _open(first)
    _open(second)
    router.refresh(force=True)
    assert router.states == {first.pk: "open", second.pk: "open"}
    unnamed, named = _item(tenant_a, first.pk), _item(tenant_a, first.pk, named=True)
    routed = router.route([unnamed, named], circuits.reserve_probes)
    assert routed.send == [unnamed] and unnamed.provider_id == third.pk, "open ones are skipped, in order"
    assert routed.wait == [named], "a named provider that is open waits"

    _open(third)
    router.refresh(force=True)
    routed = router.route([_item(tenant_a, first.pk)], circuits.reserve_probes)
    assert routed.send == [] and len(routed.wait) == 1, "every provider open: the item waits"


def test_native_push_kinds_fail_over_within_their_kind_and_each_device_is_routed(tenant_a):
    def push(name: str, kind: str, order: int):  # noqa: ANN202
        return factories.provider(tenant_a, name, kind=kind, channel="push", config={}, failover_order=order)

    ios_a, hook, android, ios_b, web = (push("ios-a", "apns", 0), push("hook", "webhook", 1),
                                        push("android", "fcm", 2), push("ios-b", "apns", 3),
                                        push("web", "webpush", 4))  # fmt: skip
    router = Router()
    router.refresh(force=True)

    def item(provider_id: int, *, named: bool = False) -> Prepared:
        made = _item(tenant_a, provider_id, named=named)
        made.channel = "push"
        return made

    assert router.next_after(item(ios_a.pk)) == ios_b.pk, "APNs to APNs, past the other kinds between"
    assert router.next_after(item(ios_b.pk)) == ios_a.pk
    assert router.next_after(item(android.pk)) is None, "the only FCM provider: nowhere to go"
    assert router.next_after(item(hook.pk)) is None, "a webhook-kind push never moves to a native kind"
    assert router.next_for_device(item(android.pk), ios_a.pk) == ios_b.pk
    assert router.next_for_device(item(ios_a.pk, named=True), ios_a.pk) == ios_a.pk, "named: stays"
    assert router.next_for_device(item(ios_a.pk), web.pk) == web.pk

    phone = Target(uuid.uuid4(), "apns", ios_a.pk, "t", True)
    tablet = Target(uuid.uuid4(), "fcm", android.pk, "t", True)
    pinned, pinned_phone = item(ios_a.pk, named=True), Target(uuid.uuid4(), "apns", ios_a.pk, "t", True)
    mixed = item(ios_a.pk)
    mixed.targets, pinned.targets = [phone, tablet], [pinned_phone]
    _open(ios_a)
    _open(android)
    router.refresh(force=True)
    router.route_devices([mixed, pinned])
    assert (phone.provider_id, phone.held) == (ios_b.pk, False), "past the open APNs provider"
    assert (tablet.provider_id, tablet.held) == (android.pk, True), "every FCM provider open: held, untried"
    assert (pinned_phone.provider_id, pinned_phone.held) == (ios_a.pk, True), "named and open: held"


def test_half_open_lets_three_probes_through_across_dispatchers(tenant_a):
    first = factories.provider(tenant_a, "first", failover_order=0, circuit={"open_seconds": 1})
    second = factories.provider(tenant_a, "second", failover_order=1)
    _open(first, ago=5)
    assert circuits.states([first.pk]) == {first.pk: "half_open"}
    one, two = Router(), Router()  # two dispatchers
    one.refresh(force=True)
    two.refresh(force=True)
    a = one.route([_item(tenant_a, first.pk) for _ in range(2)], circuits.reserve_probes)
    b = two.route([_item(tenant_a, first.pk) for _ in range(5)], circuits.reserve_probes)
    went_first = [i for i in a.send + b.send if i.provider_id == first.pk]
    assert len(went_first) == circuits.PROBES
    assert {i.provider_id for i in a.send + b.send} == {first.pk, second.pk}


def _claimed(tenant, prov, count):  # noqa: ANN001, ANN202
    specs = [NotificationSpec(channel="webhook", recipient="https://example.test/r", provider=prov, subject="s",
                              body="b", provider_named=False) for _ in range(count)]  # fmt: skip
    create_notifications(tenant, specs, actor="test")
    prepared, _ = claim_and_start(count)
    return prepared


def _outcomes(items, outcome: str):  # noqa: ANN001, ANN202
    now = datetime.now(UTC)
    kind = {"transient_error": "retry", "delivered": "delivered"}[outcome]
    return [Outcome(p.lease, kind, Attempt(p.attempt_number, now, now, outcome), retry_delay=1.0) for p in items]


def test_the_record_statement_opens_and_closes_a_breaker(tenant_a):
    first = factories.provider(tenant_a, "first", failover_order=0,
                               circuit={"min_requests": 4, "failure_threshold": 0.5, "open_seconds": 0.3})
    items = _claimed(tenant_a, first, 3)
    recorded = record_outcomes(_outcomes(items[:1], "delivered") + _outcomes(items[1:], "transient_error"))
    assert circuits.states([first.pk]) == {first.pk: "closed"}, "3 sends: under min_requests"
    assert recorded.breakers == {first.pk: "closed"}  # looked at (a failure), left closed
    items = _claimed(tenant_a, first, 3)
    recorded = record_outcomes(_outcomes(items, "transient_error"))
    assert circuits.states([first.pk]) == {first.pk: "open"}, "5 of 6 sends failed in the window"
    assert recorded.breakers == {first.pk: "open"}, "the statement that opens it says so"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE provider_circuits SET opened_at = now() - interval '1 second'")
    assert circuits.states([first.pk]) == {first.pk: "half_open"}
    items = _claimed(tenant_a, first, 1)
    record_outcomes(_outcomes(items, "transient_error"))
    assert circuits.states([first.pk]) == {first.pk: "open"}, "a failed probe re-opens"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE provider_circuits SET opened_at = now() - interval '1 second'")
    items = _claimed(tenant_a, first, 1)
    record_outcomes(_outcomes(items, "delivered"))
    assert circuits.states([first.pk]) == {first.pk: "closed"}, "a successful probe closes"
    row = ProviderCircuit.objects.get(provider=first)
    assert (row.prev_requests, row.prev_failures) == (0, 0), "and resets the window"


def test_a_providers_429s_count_neither_way_in_its_breaker(tenant_a):
    """A 429 is the provider's "slow down" (the adaptive rate's business): 20 of them inside the
    breaker's window, between real failures among successes, leave it closed (counted as failures,
    22 of 26 sends would have opened it), and /metrics still counts each 429 as a transient attempt."""
    from notifications.counters import ATTEMPTS, totals

    first = factories.provider(tenant_a, "first", failover_order=0,
                               circuit={"min_requests": 4, "failure_threshold": 0.5})  # fmt: skip

    def record(count: int, outcome: str, status: int | None = None) -> None:
        outcomes = _outcomes(_claimed(tenant_a, first, count), outcome)
        for o in outcomes:
            o.attempt.http_status = status
        record_outcomes(outcomes)

    record(4, "delivered", 200)
    record(1, "transient_error", 503)  # opens the window: 1 failure in 5
    record(20, "transient_error", 429)
    record(1, "transient_error", 503)
    assert circuits.states([first.pk]) == {first.pk: "closed"}, "2 failures in 6 sends that were not 429s"
    assert totals()[(first.pk, "transient_error", ATTEMPTS)][0] == 22

    record(3, "transient_error", 503)
    assert circuits.states([first.pk]) == {first.pk: "open"}, "5 failures in 9"


def test_a_transient_failure_moves_the_item_to_the_next_provider(tenant_a):
    from queueing.models import QueueItem

    first = factories.provider(tenant_a, "first", failover_order=0)
    second = factories.provider(tenant_a, "second", failover_order=1)
    [item] = _claimed(tenant_a, first, 1)
    [outcome] = _outcomes([item], "transient_error")
    outcome.next_provider_id = second.pk
    record_outcomes([outcome])
    assert QueueItem.objects.get(notification_id=item.notification_id).provider_id == second.pk


@pytest.mark.parametrize(("limited", "lane"), [("provider", True), ("tenant", True), (None, False)])
def test_a_retry_failed_over_takes_the_lane_of_its_next_provider(tenant_a, limited, lane):
    from queueing.models import QueueItem

    first = factories.provider(tenant_a, "first", failover_order=0)
    second = factories.provider(tenant_a, "second", failover_order=1,
                                **({"rate_per_second": 5, "burst": 5} if limited == "provider" else {}))  # fmt: skip
    [item] = _claimed(tenant_a, first, 1)
    if limited == "tenant":  # after the claim, which takes no lane here
        tenant_a.rate_per_second, tenant_a.rate_burst = 5, 5
        tenant_a.save()
    QueueItem.objects.filter(notification_id=item.notification_id).update(rate_limited=not lane)
    [outcome] = _outcomes([item], "transient_error")
    outcome.next_provider_id = second.pk
    record_outcomes([outcome])
    queued = QueueItem.objects.get(notification_id=item.notification_id)
    assert (queued.provider_id, queued.rate_limited) == (second.pk, lane)


def test_failing_over_at_claim_time_to_a_rate_limited_provider_goes_through_its_lane(tenant_a):
    """The claim took no token of the provider it fails over to: the item goes back, untried, into
    that provider's lane instead of being sent past its limit."""
    from dispatch.sending import Sender
    from queueing.models import QueueItem

    first = factories.provider(tenant_a, "first", failover_order=0, circuit={"open_seconds": 60})
    second = factories.provider(tenant_a, "second", failover_order=1, rate_per_second=5, burst=5)
    third = factories.provider(tenant_a, "third", failover_order=2)
    [item] = _claimed(tenant_a, first, 1)
    _open(first)
    router = Router()
    router.refresh(force=True)
    assert router.limited == {second.pk}
    routed = router.route([item], circuits.reserve_probes)
    assert routed.send == [] and routed.relane == [item] and item.provider_id == second.pk

    record_outcomes([Sender.to_lane(item)])
    queued = QueueItem.objects.get(notification_id=item.notification_id)
    assert (queued.provider_id, queued.rate_limited, queued.attempts) == (second.pk, True, 0)
    assert queued.locked_until is None

    _open(second)  # past it, an unlimited provider: sent by the claim that routed it
    [again] = _claimed(tenant_a, first, 1)
    router.refresh(force=True)
    routed = router.route([again], circuits.reserve_probes)
    assert routed.send == [again] and again.provider_id == third.pk and routed.relane == []


def test_metrics_and_providers_show_breakers(tenant_a, api_a):
    first = factories.provider(tenant_a, "first", failover_order=0)
    _open(first)
    text = Client().get("/metrics").content.decode()
    assert f'omnipost_provider_circuit_state{{provider="first",provider_id="{first.pk}",state="open"}} 1.0' in text
    assert api_a.get("/api/v1/providers/first").json()["circuit_state"] == "open"


def test_every_dispatcher_routes_around_a_breaker_at_its_next_record(tenant_a):
    """A breaker one dispatcher's record opens is routed around by that dispatcher, and by a peer at
    the peer's next record of a send to that provider, not at their next refresh."""
    first = factories.provider(tenant_a, "first", failover_order=0,
                               circuit={"min_requests": 2, "failure_threshold": 0.5, "open_seconds": 60})
    second = factories.provider(tenant_a, "second", failover_order=1)
    opener, peer = Router(), Router()  # two dispatchers, both refreshed while every breaker was closed
    opener.refresh(force=True)
    peer.refresh(force=True)
    in_flight_at_peer = _claimed(tenant_a, first, 1)  # the peer's send, on the wire while the breaker opens

    recorded = record_outcomes(_outcomes(_claimed(tenant_a, first, 2), "transient_error"))
    opener.learn(recorded.breakers)
    assert opener.states == {first.pk: "open"}
    routed = opener.route([_item(tenant_a, first.pk)], circuits.reserve_probes)
    assert [i.provider_id for i in routed.send] == [second.pk], "its next claim goes to the next provider"

    recorded = record_outcomes(_outcomes(in_flight_at_peer, "delivered"))  # the peer's send succeeded
    assert recorded.breakers == {first.pk: "open"}, "an open breaker of the batch is read, whoever opened it"
    peer.learn(recorded.breakers)
    routed = peer.route([_item(tenant_a, first.pk)], circuits.reserve_probes)
    assert [i.provider_id for i in routed.send] == [second.pk]

    # a batch of closed breakers and no failure looks at none (the statement's usual case)
    assert record_outcomes(_outcomes(_claimed(tenant_a, second, 2), "delivered")).breakers == {}
    peer.learn({first.pk: "closed"})
    assert peer.states == {}
