"""Backoff with full jitter, Retry-After, and attempt budgets."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from dlq.retry import DEFAULT_MAX_RETRY_AFTER, RetryPolicy, exhausted, parse_retry_after

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def test_from_settings_reads_base_and_cap(settings):
    settings.OMNIPOST_RETRY_BASE_SECONDS = 0.5
    settings.OMNIPOST_RETRY_MAX_SECONDS = 30
    policy = RetryPolicy.from_settings()
    assert (policy.base, policy.cap, policy.max_retry_after) == (0.5, 30.0, DEFAULT_MAX_RETRY_AFTER)


def test_ceiling_grows_exponentially_up_to_the_cap():
    policy = RetryPolicy(base=2, cap=3600)
    assert [policy.ceiling(n) for n in range(1, 8)] == [2, 4, 8, 16, 32, 64, 128]
    assert policy.ceiling(12) == 3600 and policy.ceiling(10_000) == 3600
    assert policy.ceiling(0) == 2  # defensive: attempt numbers start at 1


def test_delay_is_full_jitter_with_injected_rng():
    policy = RetryPolicy(base=2, cap=3600)
    assert policy.delay(3, rng=lambda: 0.0) == 0.0
    assert policy.delay(3, rng=lambda: 0.5) == 4.0
    assert policy.delay(3, rng=lambda: 0.999999) == pytest.approx(8.0, rel=1e-5)


def test_jitter_always_within_zero_and_cap():
    policy = RetryPolicy(base=1.5, cap=60)
    rng = random.Random(1234)
    for attempt in range(1, 40):
        ceiling = policy.ceiling(attempt)
        for _ in range(200):
            delay = policy.delay(attempt, rng=rng.random)
            assert 0.0 <= delay <= ceiling <= 60


def test_retry_after_is_the_earliest_retry_time():
    policy = RetryPolicy(base=2, cap=60)
    assert policy.delay(1, retry_after=30, rng=lambda: 0.5) == 30  # jitter (1.0) below Retry-After
    assert policy.delay(8, retry_after=5, rng=lambda: 0.5) == 30  # jitter (30.0) already later
    assert policy.delay(1, retry_after=600, rng=lambda: 0.1) == 600  # may exceed the cap
    assert policy.delay(1, retry_after=10**9, rng=lambda: 0.1) == DEFAULT_MAX_RETRY_AFTER  # but is bounded
    assert policy.delay(1, retry_after=0, rng=lambda: 0.25) == 0.5
    bounded = RetryPolicy(base=2, cap=60, max_retry_after=120)
    assert bounded.delay(1, retry_after=3600, rng=lambda: 0.0) == 120


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        RetryPolicy(base=0, cap=10)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("Sun, 01 Mar 2026 12:02:00 GMT", 120.0),  # IMF-fixdate
        ("Sunday, 01-Mar-26 12:00:30 GMT", 30.0),  # RFC 850
        ("Sun Mar  1 12:01:00 2026", 60.0),  # asctime
        ("Sun, 01 Mar 2026 11:00:00 GMT", 0.0),  # in the past
        ("", None),
        (None, None),
        ("-5", None),
        ("soon", None),
        ("Sun, 99 Foo 2026 25:61:00 GMT", None),
    ],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value, NOW) == expected


def test_parse_retry_after_defaults_to_now():
    when = (datetime.now(UTC) + timedelta(seconds=90)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert 85 <= parse_retry_after(when) <= 90


@pytest.mark.parametrize(("count", "budget", "done"), [(0, 8, False), (7, 8, False), (8, 8, True), (9, 8, True)])
def test_exhausted(count, budget, done):
    assert exhausted(count, budget) is done
