"""Failover order and shared circuit breakers with real dispatcher processes."""

from __future__ import annotations

import collections
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from notifications.models import DeliveryAttempt, Notification
from notifications.services import NotificationSpec, create_notifications
from providers.circuit import CLOSED, OPEN
from queueing import ratelimit
from queueing.models import QueueItem, RateBucket
from routing import circuits
from routing.models import ProviderCircuit
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = pytest.mark.django_db(transaction=True)


def _hook(tenant, name, receiver, order, **extra):
    return factories.provider(tenant, name, config={"url": receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, failover_order=order, **extra)


def _send(tenant, prov, count, *, named=False) -> list[Notification]:
    specs = [NotificationSpec(channel="webhook", recipient="https://example.test/r", provider=prov, subject="s",
                              body="b", provider_named=named) for _ in range(count)]  # fmt: skip
    return create_notifications(tenant, specs, actor="test")


def _delivered(receiver: HttpReceiver) -> collections.Counter:
    return collections.Counter(r.webhook_id for r in receiver.requests if 200 <= r.status < 300)


def _done(ids) -> bool:  # noqa: ANN001
    return not QueueItem.objects.filter(notification_id__in=list(ids)).exists()


@pytest.fixture
def fast_retries(subprocess_env):
    return {**subprocess_env, "OMNIPOST_RETRY_BASE_SECONDS": "0.05", "OMNIPOST_RETRY_MAX_SECONDS": "0.2"}


def test_an_open_breaker_gets_at_most_a_claim_or_two_per_dispatcher(tenant_a, fast_retries, tmp_path):
    """A provider that answers 503 at once to three dispatchers of concurrency 4: once its breaker
    opens, each dispatcher learns it from its next record statement, not half a second later, so
    the provider sees the failures that opened it and at most what each dispatcher had claimed by
    then (two claims of `concurrency` each), not the 90-186 sends a half-second refresh let through.
    The failures that open it are min_requests, plus what the other dispatchers' record statements
    running at the same moment add (each of their commits saw the count below the threshold): up to
    one batch of `concurrency` each."""
    concurrency, dispatchers, min_requests = 4, 3, 10
    with (
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120, status=503) as first_rx,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120) as second_rx,
    ):
        circuit = {"failure_threshold": 0.5, "min_requests": min_requests, "window_seconds": 30, "open_seconds": 60}
        first = _hook(tenant_a, "first", first_rx, 0, circuit=circuit)
        _hook(tenant_a, "second", second_rx, 1)
        procs = start_dispatchers(dispatchers, fast_retries, "--batch-size", str(concurrency), "--concurrency",
                                  str(concurrency), log_dir=tmp_path)  # fmt: skip
        try:
            assert wait_started(tmp_path, dispatchers)
            sent = _send(tenant_a, first, 300)
            assert wait_until(lambda: _done(n.id for n in sent), 60)
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 30) == [0] * dispatchers
        on_second = _delivered(second_rx)
    assert circuits.states([first.pk])[first.pk] == OPEN
    print(f"the open provider saw {len(first_rx.requests)} sends")  # shown with -s
    opening = min_requests + (dispatchers - 1) * concurrency
    assert len(first_rx.requests) <= opening + dispatchers * 2 * concurrency, len(first_rx.requests)
    assert set(on_second) == {str(n.id) for n in sent} and max(on_second.values()) == 1


def test_breaker_opens_traffic_moves_to_the_next_provider_and_returns(tenant_a, fast_retries, tmp_path):
    with (
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120, status=503) as first_rx,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120) as second_rx,
    ):
        # Open for a minute, so steps 1 and 2 (checked while it is open) fit in it however loaded the machine;
        # step 3 then moves the breaker's clock past it instead of waiting.
        circuit = {"failure_threshold": 0.5, "min_requests": 10, "window_seconds": 30, "open_seconds": 60}
        first = _hook(tenant_a, "first", first_rx, 0, circuit=circuit)
        second = _hook(tenant_a, "second", second_rx, 1)
        procs = start_dispatchers(3, fast_retries, "--batch-size", "5", "--concurrency", "10", log_dir=tmp_path)
        try:
            assert wait_started(tmp_path, 3)
            # 1. The first provider answers 503: each transient failure sends the next try to the second,
            #    and the failures open the first's breaker (shared: three dispatchers add to it).
            wave1 = _send(tenant_a, first, 20)
            assert wait_until(lambda: _done(n.id for n in wave1), 30)
            # the records that open it may land a few seconds after the last delivery on a loaded machine
            assert wait_until(lambda: circuits.states([first.pk])[first.pk] == OPEN, 20)
            seen_by_first = len(first_rx.requests)
            assert 10 <= seen_by_first <= 20
            # the dispatchers' view of the breakers (routing.failover.REFRESH_SECONDS, 0.5 s), with room for a
            # loaded machine: at 0.6 s a dispatcher still routed one of wave 2 to the open provider once
            time.sleep(2.0)

            # 2. While it is open, new notifications go straight to the second: the first sees nothing.
            wave2 = _send(tenant_a, first, 30)
            assert wait_until(lambda: _done(n.id for n in wave2), 30)
            assert circuits.states([first.pk])[first.pk] == OPEN
            assert len(first_rx.requests) == seen_by_first
            tried = DeliveryAttempt.objects.filter(notification_id__in=[n.id for n in wave2])
            assert set(tried.values_list("provider_id", flat=True)) == {second.pk}
            assert tried.count() == 30, "skipping an open provider costs no attempt"

            # 3. It recovers: once open_seconds pass (its opened_at moved a minute back: breakers read the
            #    database's clock), probes go through, one success closes the breaker, and traffic returns
            #    to the first provider.
            first_rx.behaviour.status = 200
            ProviderCircuit.objects.filter(provider=first).update(opened_at=F("opened_at") - timedelta(seconds=60))
            trickle: list[Notification] = []
            deadline = time.monotonic() + 40
            while circuits.states([first.pk])[first.pk] != CLOSED and time.monotonic() < deadline:
                trickle += _send(tenant_a, first, 1)
                time.sleep(0.2)
            assert circuits.states([first.pk])[first.pk] == CLOSED
            # the dispatchers' view of the breakers (routing.failover.REFRESH_SECONDS, 0.5 s), with room for a
            # loaded machine: at 0.6 s a dispatcher still routed one of wave 2 to the open provider once
            time.sleep(2.0)
            wave3 = _send(tenant_a, first, 20)
            everything = [*wave1, *wave2, *trickle, *wave3]
            assert wait_until(lambda: _done(n.id for n in everything), 30)
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 30) == [0, 0, 0]
        on_first, on_second = _delivered(first_rx), _delivered(second_rx)
    assert {str(n.id) for n in wave3} <= set(on_first), "traffic returned to the first provider"
    assert not set(on_first) & set(on_second), "no notification reached both receivers"
    assert max([*on_first.values(), *on_second.values()]) == 1
    assert set(on_first) | set(on_second) == {str(n.id) for n in everything}
    assert set(Notification.objects.filter(pk__in=[n.id for n in everything]).values_list("status", flat=True)) == {
        "delivered"
    }
    # each attempt shows the provider it went through
    first_tries = DeliveryAttempt.objects.filter(notification_id__in=[n.id for n in wave1]).order_by("number")
    assert {a.provider_id for a in first_tries if a.number == 1} == {first.pk}
    assert {a.provider_id for a in first_tries if a.outcome == "delivered"} == {second.pk}


def test_a_permanent_failure_does_not_fail_over_and_a_named_provider_never_does(tenant_a, fast_retries, tmp_path):
    with (
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60, status=400) as first_rx,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60) as second_rx,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60, status=503) as pinned_rx,
    ):
        first = _hook(tenant_a, "first", first_rx, 0)
        _hook(tenant_a, "second", second_rx, 1)
        pinned = _hook(tenant_a, "pinned", pinned_rx, None, max_attempts=3)
        bad = _send(tenant_a, first, 10)
        named = _send(tenant_a, pinned, 5, named=True)
        procs = start_dispatchers(1, fast_retries, "--batch-size", "20", log_dir=tmp_path)
        assert wait_until(lambda: _done(n.id for n in [*bad, *named]), 30)
        for proc in procs:
            proc.terminate()
        wait_exit(procs, 20)
        assert not second_rx.requests, "a 400 is bad everywhere: no failover"
        assert len(first_rx.requests) == 10
        assert len(pinned_rx.requests) == 15, "a notification that names its provider retries there only"
    statuses = dict(Notification.objects.filter(pk__in=[n.id for n in bad]).values_list("status", "status"))
    assert set(statuses) == {"failed"}
    assert set(Notification.objects.filter(pk__in=[n.id for n in named]).values_list("status", flat=True)) == {
        "dead_lettered"
    }


def test_traffic_moved_off_an_open_breaker_keeps_to_the_next_providers_rate_limit(tenant_a, fast_retries, tmp_path):
    """The first provider's breaker is open; the second has a rate limit. Two dispatchers claim the
    first's queue, route each item to the second and put it in the second's lane, untried: it
    reaches the second's receiver once, and no send starts (as its attempt records) before the
    second's bucket allowed it."""
    rate, burst, count = 20, 5, 60
    with (
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120) as first_rx,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120) as second_rx,
    ):
        first = _hook(tenant_a, "first", first_rx, 0, circuit={"open_seconds": 600})
        second = _hook(tenant_a, "second", second_rx, 1, rate_per_second=rate, burst=burst)
        now = timezone.now()
        ProviderCircuit.objects.create(provider=first, state="open", opened_at=now, probes=0, window_started_at=now,
                                       updated_at=now)  # fmt: skip
        # The second's bucket empty, its clock an hour ahead: nothing is granted while the dispatchers start.
        key = ratelimit.provider_key(second.pk)
        RateBucket.objects.create(key=key, rate=rate, effective_rate=rate, burst=burst, tokens=0,
                                  updated_at=now + timedelta(hours=1))
        sent = _send(tenant_a, first, count)
        procs = start_dispatchers(2, fast_retries, "--batch-size", "20", "--concurrency", "20", log_dir=tmp_path)
        try:
            assert wait_started(tmp_path, 2)
            with connection.cursor() as cursor:
                cursor.execute("UPDATE rate_limit_buckets SET tokens = %s, updated_at = clock_timestamp()"
                               " WHERE key = %s RETURNING updated_at", [burst, key])
                opened = cursor.fetchone()[0]
            assert wait_until(lambda: _done(n.id for n in sent), 60)
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 30) == [0, 0]
        assert not first_rx.requests, "nothing went to the provider whose breaker is open"
        on_second = _delivered(second_rx)
    assert set(on_second) == {str(n.id) for n in sent} and max(on_second.values()) == 1
    tried = DeliveryAttempt.objects.filter(notification_id__in=[n.id for n in sent])
    assert tried.count() == count and set(tried.values_list("provider_id", flat=True)) == {second.pk}
    # The i-th send starts at least (i - burst) / rate after the bucket opened, full: the lane, not the
    # claim, paced them (the database's clock and the dispatchers' are this machine's: no slack).
    starts = sorted(tried.values_list("started_at", flat=True))
    worst = max(i + 1 - (burst + rate * (t - opened).total_seconds()) for i, t in enumerate(starts))
    assert worst <= 1e-6, f"{worst:.2f} sends above the second provider's line"
    assert set(Notification.objects.filter(pk__in=[n.id for n in sent]).values_list("status", flat=True)) == {
        "delivered"
    }


def test_a_notification_without_a_provider_starts_at_the_head_of_the_order(tenant_a, api_a):
    factories.provider(tenant_a, "default-hook", is_default=True)
    factories.provider(tenant_a, "second", failover_order=5)
    factories.provider(tenant_a, "head", failover_order=1)
    created = api_a.post("/api/v1/notifications", {"channel": "webhook", "recipient": "https://example.test/x",
                                                    "body": "b"}, format="json")  # fmt: skip
    assert created.status_code == 201, created.content
    n = Notification.objects.get(pk=created.json()["id"])
    assert (n.provider.name, n.provider_named) == ("head", False)
    named = api_a.post("/api/v1/notifications", {"channel": "webhook", "recipient": "https://example.test/x",
                                                  "body": "b", "provider": "second"}, format="json")  # fmt: skip
    assert Notification.objects.get(pk=named.json()["id"]).provider_named is True


def test_providers_api_shows_failover_order_circuit_and_state(tenant_a, api_a):
    created = api_a.post("/api/v1/providers", {
        "name": "hook", "channel": "webhook", "kind": "webhook", "config": {"url": "https://example.test/h"},
        "secrets": {"signing_secret": TEST_SIGNING_SECRET}, "failover_order": 2,
        "circuit": {"failure_threshold": 0.25, "min_requests": 5},
    }, format="json")  # fmt: skip
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["failover_order"] == 2
    assert body["circuit"] == {"failure_threshold": 0.25, "min_requests": 5, "window_seconds": 60.0,
                               "open_seconds": 30.0}  # fmt: skip
    assert body["circuit_state"] == "closed"
    bad = api_a.patch("/api/v1/providers/hook", {"circuit": {"failure_threshold": 2}}, format="json")
    assert bad.status_code == 400 and "circuit" in bad.json()["error"]["details"]
    listed = api_a.get("/api/v1/providers").json()["results"]
    assert [p["circuit_state"] for p in listed] == ["closed"]
