"""Shared token buckets: their arithmetic on a clock the test moves (the line, AIMD), and real
dispatcher processes sharing them (never above the line, the noisy tenant, a 429 slows the lane)."""

from __future__ import annotations

import json
import re
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dispatch.claims import Claimer
from dispatch.providers import ProviderCache
from notifications.models import DeliveryAttempt, Notification
from queueing import ratelimit
from queueing.models import QueueItem, RateBucket
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = [pytest.mark.django_db(transaction=True)]


def hook_for(tenant, receiver, name="hook", **extra):
    return factories.provider(tenant, name, config={"url": receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, **extra)


def advance(key: str, seconds: float) -> None:
    """`seconds` pass for the bucket `key`: its clocks are moved back (the buckets read the database's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE rate_limit_buckets SET updated_at = updated_at - make_interval(secs => %(s)s),"
            " decreased_at = decreased_at - make_interval(secs => %(s)s),"
            " increased_at = increased_at - make_interval(secs => %(s)s) WHERE key = %(key)s",
            {"s": seconds, "key": key},
        )


def bucket_seconds_ago(key: str, seconds: float, tokens: float = 0.0) -> None:
    """The bucket `key` holds `tokens`, last refilled `seconds` ago on the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE rate_limit_buckets SET tokens = %s, updated_at = clock_timestamp() - make_interval(secs => %s)"
            " WHERE key = %s",
            [tokens, seconds, key],
        )


def test_take_is_shared_and_never_exceeds_burst(tenant_a):
    prov = factories.provider(tenant_a, rate_per_second=1, burst=5)
    lanes = {prov.pk: ratelimit.LaneSpec(prov.pk, tenant_a.pk, 1.0, 5.0, None, None)}
    first = ratelimit.take(lanes, {prov.pk: 100})
    assert first.granted == {prov.pk: 5}
    second = ratelimit.take(lanes, {prov.pk: 100})
    assert second.granted[prov.pk] <= 1 and second.next_token_in is not None
    ratelimit.give_back(lanes, {prov.pk: 3})
    assert RateBucket.objects.get(key=f"provider:{prov.pk}").tokens <= 5


def test_claimers_sharing_a_bucket_claim_exactly_what_it_earns(tenant_a):
    """Four dispatchers' claimers over one bucket: the burst, then each second's `rate` tokens, are
    claimed in full between them (none lost, none over; never more than the burst after an idle
    spell), and a starved claim says when the next token comes: a dispatcher sleeps no longer than
    that, so the processes together run the lane at its rate."""
    rate, burst, seconds = 1, 10, 8  # 1/s: the real time a round takes adds less than a token
    prov = factories.provider(tenant_a, rate_per_second=rate, burst=burst,
                              secrets={"signing_secret": TEST_SIGNING_SECRET})
    factories.queued(tenant_a, prov, 100, rate_limited=True)
    key = ratelimit.provider_key(prov.pk)
    now = [0.0]
    claimers = [Claimer(None, 30.0, ProviderCache(lambda: now[0]), clock=lambda: now[0]) for _ in range(4)]

    def claim_round() -> tuple[int, list[float | None]]:
        claimed, waits = 0, []
        for claimer in claimers:
            result = claimer.claim(3)
            assert not result.skipped and not result.unready
            claimed += len(result.send)
            waits.append(result.next_token_in)
        now[0] += 1.0  # the claimers' own clock: lanes are looked up again
        return claimed, waits

    assert claim_round()[0] == burst
    for _ in range(4):
        bucket_seconds_ago(key, seconds)
        claimed, waits = claim_round()
        assert claimed == rate * seconds
        assert waits[-1] is not None and 0 < waits[-1] <= 1 / rate  # starved: the next token within 1/rate
    bucket_seconds_ago(key, 60)  # a long idle refills to the burst, no further
    assert claim_round()[0] == burst
    assert QueueItem.objects.filter(lock_token__isnull=False).count() == 2 * burst + 4 * rate * seconds


@pytest.mark.slow
def test_four_processes_never_exceed_the_line(tenant_a, subprocess_env, tmp_path):
    """Four real dispatchers share one bucket: every item is delivered once, and no send starts (as its
    attempt records) before the bucket allowed it: the i-th at least (i - burst) / rate after the
    bucket opened, full, at a time the test sets."""
    rate, burst, total = 50, 10, 200
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120) as receiver:
        prov = hook_for(tenant_a, receiver, rate_per_second=rate, burst=burst)
        factories.queued(tenant_a, prov, total, rate_limited=True)
        key = ratelimit.provider_key(prov.pk)
        # Empty, its clock an hour ahead: nothing is granted while the dispatchers start.
        RateBucket.objects.create(key=key, rate=rate, effective_rate=rate, burst=burst, tokens=0,
                                  updated_at=timezone.now() + timedelta(hours=1))
        procs = start_dispatchers(4, subprocess_env, "--batch-size", "50", "--concurrency", "50", log_dir=tmp_path)
        assert wait_started(tmp_path, 4)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE rate_limit_buckets SET tokens = %s, updated_at = clock_timestamp() WHERE key = %s"
                           " RETURNING updated_at", [burst, key])
            opened = cursor.fetchone()[0]
        assert wait_until(lambda: Notification.objects.filter(status="delivered").count() == total, 60)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert wait_exit(procs, 20) == [0] * 4
        ids = [r.webhook_id for r in receiver.requests]
    assert len(ids) == len(set(ids)) == total
    starts = sorted(DeliveryAttempt.objects.values_list("started_at", flat=True))
    assert len(starts) == total
    # The database's clock and the dispatchers' are this machine's: no slack.
    worst = max(i + 1 - (burst + rate * (t - opened).total_seconds()) for i, t in enumerate(starts))
    assert worst <= 1e-6, f"{worst:.2f} sends above the line"


def _claims_by_tenant(log_dir) -> dict[str, int]:
    totals: dict[str, int] = {}
    for path in log_dir.glob("dispatcher*.log"):
        for match in re.finditer(r"claims by tenant: (\{.*\})", path.read_text()):
            for tenant, count in json.loads(match.group(1)).items():
                totals[tenant] = totals.get(tenant, 0) + count
    return totals


@pytest.mark.slow
def test_noisy_tenant_does_not_hold_back_others_or_churn_claims(tenant_a, tenant_b, subprocess_env, tmp_path):
    """Tenant A, limited to 2/s, has 20,000 queued; B's 500 (unlimited) are queued beside them. B is
    never paced by A's bucket: all of B's are delivered in less time than A's bucket needs for a tenth
    as many, A stays under its line, and A's items are not claimed over and over to be given back."""
    rate = 2
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=180, record=True) as receiver:
        tenant_a.rate_per_second, tenant_a.rate_burst = rate, rate
        tenant_a.save()
        factories.bulk_queued_sql(tenant_a, hook_for(tenant_a, receiver, "noisy"), 20_000)
        QueueItem.objects.filter(tenant=tenant_a).update(rate_limited=True)
        b_ids = [n.pk for n in factories.queued(tenant_b, hook_for(tenant_b, receiver, "calm"), 500)]
        started = time.monotonic()
        procs = start_dispatchers(2, subprocess_env, log_dir=tmp_path)
        # A's bucket needs (500 - 2) / 2 = 249 s for as many sends as B has.
        assert wait_until(lambda: Notification.objects.filter(pk__in=b_ids, status="delivered").count() == 500, 60)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert wait_exit(procs, 20) == [0, 0]
        elapsed = time.monotonic() - started
    delivered_a = Notification.objects.filter(tenant=tenant_a, status="delivered").count()
    claims_a = _claims_by_tenant(tmp_path).get(str(tenant_a.pk), 0)
    assert 0 < delivered_a <= rate + rate * elapsed
    assert delivered_a <= claims_a <= 2 * delivered_a, f"{claims_a} claims for {delivered_a} deliveries"


def test_aimd_decreases_at_most_once_a_second_and_climbs_back(tenant_a):
    """A 429 multiplies the effective rate by 0.7, once a second at most, never below the floor;
    success adds 2 % of the configured rate per second (at most 5 s' worth) back up to it."""
    prov = factories.provider(tenant_a, rate_per_second=100, burst=10)
    lanes = {prov.pk: ratelimit.LaneSpec(prov.pk, tenant_a.pk, 100.0, 10.0, None, None)}
    key = ratelimit.provider_key(prov.pk)
    ratelimit.take(lanes, {prov.pk: 1})

    def effective() -> float:
        return RateBucket.objects.get(key=key).effective_rate

    ratelimit.adapt({prov.pk}, set())
    assert effective() == pytest.approx(70.0)
    assert RateBucket.objects.get(key=key).tokens <= 1.0  # the burst is not sent into a throttling receiver
    ratelimit.adapt({prov.pk}, set())  # the same burst of 429s
    assert effective() == pytest.approx(70.0)
    advance(key, 1.0)
    changed = time.monotonic()
    ratelimit.adapt({prov.pk}, set())
    assert effective() == pytest.approx(49.0)
    advance(key, 2.0)
    ratelimit.adapt(set(), {prov.pk})
    # 2 s since the last change, and the database's clock went on meanwhile (however loaded the machine)
    real = time.monotonic() - changed
    assert 49.0 + 100 * 0.02 * 2.0 - 0.01 <= effective() <= 49.0 + 100 * 0.02 * (2.0 + real) + 0.01
    advance(key, 60.0)
    ratelimit.adapt(set(), {prov.pk})
    assert effective() == pytest.approx(53.0 + 100 * 0.02 * 5.0, abs=0.1)  # a long quiet counts 5 s
    for _ in range(30):
        advance(key, 5.0)
        ratelimit.adapt(set(), {prov.pk})
    assert effective() == 100.0  # never above the configured rate
    for _ in range(20):
        advance(key, 1.0)
        ratelimit.adapt({prov.pk}, set())
    assert effective() == pytest.approx(5.0)  # the floor: 5 % of the configured rate


def test_adaptive_rate_converges_on_what_the_receiver_accepts(tenant_a):
    """A provider configured at 100/s whose receiver accepts 20 a second (429 above that), sent to every
    0.2 s for 30 s on a clock the test moves: after the first 15 s, under 10 % of sends are 429s and
    14–21 a second are accepted."""
    prov = factories.provider(tenant_a, rate_per_second=100, burst=10)
    lanes = {prov.pk: ratelimit.LaneSpec(prov.pk, tenant_a.pk, 100.0, 10.0, None, None)}
    key = ratelimit.provider_key(prov.pk)
    accepts, step, horizon, settled = 20, 0.2, 30.0, 15.0
    second, this_second = -1, 0
    late: list[int] = []
    last = time.monotonic()
    for n in range(round(horizon / step)):
        now = n * step  # the bucket's clock, seen from here
        granted = ratelimit.take(lanes, {prov.pk: 50}).granted[prov.pk]
        statuses = []
        for _ in range(granted):  # the receiver's rule: 429 above `accepts` in one calendar second
            if int(now) != second:
                second, this_second = int(now), 0
            this_second += 1
            statuses.append(429 if this_second > accepts else 200)
        if now >= settled:
            late += statuses
        ratelimit.adapt({prov.pk} if 429 in statuses else set(), {prov.pk} if 200 in statuses else set())
        # `step` passes for the bucket between two takes however long this round took: the real time
        # that passed is taken off what its clock is moved back (forward, on a very slow round).
        real, last = time.monotonic() - last, time.monotonic()
        advance(key, step - real)
    throttled = late.count(429) / len(late)
    accepted_rate = late.count(200) / (horizon - settled)
    effective = RateBucket.objects.get(key=key).effective_rate
    assert throttled < 0.10, f"429 share after {settled:g} s: {throttled:.1%}"
    assert 14 <= accepted_rate <= 21, f"accepted {accepted_rate:.1f}/s"
    assert 10 <= effective <= 30, f"effective rate {effective:.1f}/s"


@pytest.mark.slow
def test_dispatchers_slow_a_lane_on_429_and_deliver_every_throttled_item(tenant_a, subprocess_env):
    """The wiring of AIMD: real dispatchers sending at 100/s into a receiver that accepts 20 a second
    lower the provider's effective rate, and every item answered 429 is retried and delivered once."""
    env = {**subprocess_env, "OMNIPOST_MAX_ATTEMPTS": "100", "OMNIPOST_RETRY_BASE_SECONDS": "0.5",
           "OMNIPOST_RETRY_MAX_SECONDS": "2"}
    total = 80
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120, rate_limit=20) as receiver:
        prov = hook_for(tenant_a, receiver, rate_per_second=100, burst=10)
        factories.queued(tenant_a, prov, total, rate_limited=True)
        procs = start_dispatchers(2, env, "--batch-size", "20", "--concurrency", "50")
        assert wait_until(lambda: Notification.objects.filter(status="delivered").count() == total, 90)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert wait_exit(procs, 20) == [0, 0]
        accepted = [r.webhook_id for r in receiver.requests if r.status == 200]
    assert len(accepted) == len(set(accepted)) == total
    throttled = set(DeliveryAttempt.objects.filter(http_status=429).values_list("notification_id", flat=True))
    assert throttled, "the receiver never answered 429"
    assert RateBucket.objects.get(key=ratelimit.provider_key(prov.pk)).effective_rate < 100
