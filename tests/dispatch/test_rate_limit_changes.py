"""A provider's rate limit changed over the API while its notifications wait: queued items follow
the limit as it is at claim time, in both directions, with a real dispatcher process
and a loopback receiver whose ledger of request times is checked."""

from __future__ import annotations

import signal
import time

import pytest
from django.db.models import Min

from notifications.models import DeliveryAttempt, Notification
from queueing import ratelimit
from queueing.models import QueueItem, RateBucket
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROVIDERS = "/api/v1/providers"


def hook_for(tenant, receiver, **extra):  # noqa: ANN001, ANN201
    return factories.provider(tenant, "hook", config={"url": receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, **extra)


def stop(procs) -> None:  # noqa: ANN001
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    assert wait_exit(procs, 20) == [0] * len(procs)


def test_rate_limit_removed_while_20_wait_sends_them_all_within_seconds(tenant_a, api_a, subprocess_env):
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60) as receiver:
        hook = hook_for(tenant_a, receiver, rate_per_second=0.01, burst=1)  # one now, the next in 100 s
        factories.queued(tenant_a, hook, 20)
        assert set(QueueItem.objects.values_list("rate_limited", flat=True)) == {True}  # decided at enqueue
        procs = start_dispatchers(1, subprocess_env)
        try:
            assert receiver.wait_for(1, timeout=20)
            time.sleep(0.5)  # the limit holds: nothing more goes out
            assert len(receiver.requests) == 1
            response = api_a.patch(f"{PROVIDERS}/hook", {"rate_limit": None}, format="json")
            assert response.status_code == 200, response.content
            removed_at = time.monotonic()
            assert not QueueItem.objects.filter(rate_limited=True).exists()  # in the PATCH's transaction
            assert receiver.wait_for(20, timeout=10), len(receiver.requests)
            took = time.monotonic() - removed_at
        finally:
            stop(procs)
    assert took < 5, f"{took:.1f}s to send the 19 that waited"
    assert len({r.webhook_id for r in receiver.requests}) == 20  # each once
    assert Notification.objects.filter(status="delivered").count() == 20


def test_rate_limit_set_while_60_wait_holds_from_their_due_time(tenant_a, api_a, subprocess_env):
    rate, burst = 20.0, 5
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60) as receiver:
        hook = hook_for(tenant_a, receiver)  # no limit yet
        # Waiting for their time (a retry's delay, say) while the dispatcher runs: due in 2 s.
        factories.queued(tenant_a, hook, 60, delay=2)
        assert set(QueueItem.objects.values_list("rate_limited", "ready")) == {(False, False)}
        # The bucket the limit will use, full, its clock at the moment they are due (it cannot refill
        # before, the database's clock being the one it reads): what the line below is measured from.
        due = QueueItem.objects.aggregate(due=Min("available_at"))["due"]
        RateBucket.objects.create(key=ratelimit.provider_key(hook.pk), rate=rate, effective_rate=rate,
                                  burst=burst, tokens=burst, updated_at=due)
        procs = start_dispatchers(1, subprocess_env)
        try:
            limit = {"rate_limit": {"rate_per_second": rate, "burst": burst}}
            response = api_a.patch(f"{PROVIDERS}/hook", limit, format="json")
            assert response.status_code == 200, response.content
            assert set(QueueItem.objects.values_list("rate_limited", flat=True)) == {True}
            assert receiver.wait_for(60, timeout=30), len(receiver.requests)
        finally:
            stop(procs)
    assert len({r.webhook_id for r in receiver.requests}) == 60
    # The i-th send starts (as its attempt records) at least (i - burst) / rate after they were due: the
    # database's clock and the dispatcher's are this machine's, so no slack.
    starts = sorted(DeliveryAttempt.objects.values_list("started_at", flat=True))
    assert len(starts) == 60 and starts[0] >= due
    worst = max(i + 1 - (burst + rate * (t - due).total_seconds()) for i, t in enumerate(starts))
    assert worst <= 1e-6, f"{worst:.2f} sends above the line"
