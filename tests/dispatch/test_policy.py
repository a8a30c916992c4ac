"""The dispatcher's pure policies, as tables: what becomes of a result, how a claim is split."""

from __future__ import annotations

import pytest

from dispatch import policy
from dlq.retry import RetryPolicy
from providers.kinds.base import DeliveryResult

RETRY = RetryPolicy(base=2.0, cap=60.0)
HALF = lambda: 0.5  # noqa: E731 - the jitter's draw, fixed


def ok(**kw) -> DeliveryResult:
    return DeliveryResult(delivered=True, http_status=200, **kw)


def err(**kw) -> DeliveryResult:
    return DeliveryResult(delivered=False, **kw)


# result, attempts this run, max attempts -> kind, retry delay, failure class, error code
DECISIONS = [
    ("2xx", ok(), 1, 8, "delivered", 0.0, "", ""),
    ("2xx on the last attempt", ok(), 8, 8, "delivered", 0.0, "", ""),
    ("503, first try", err(http_status=503), 1, 8, "retry", 1.0, "transient", "http_503"),
    ("503, third try: 2·2² window", err(http_status=503), 3, 8, "retry", 4.0, "transient", "http_503"),
    ("503, capped window", err(http_status=503), 7, 8, "retry", 30.0, "transient", "http_503"),
    ("503, budget used up", err(http_status=503), 8, 8, "dead_lettered", 0.0, "transient", "http_503"),
    ("provider budget of 1", err(http_status=500), 1, 1, "dead_lettered", 0.0, "transient", "http_500"),
    ("429 with Retry-After", err(http_status=429, retry_after=120.0), 1, 8, "retry", 120.0, "transient", "http_429"),
    ("timeout", err(error_code="timeout"), 2, 8, "retry", 2.0, "transient", "timeout"),
    ("400 fails at once", err(http_status=400), 1, 8, "failed", 0.0, "permanent", "http_400"),
    ("401 fails at once", err(http_status=401), 1, 8, "failed", 0.0, "permanent", "http_401"),
    ("3xx is permanent", err(http_status=302), 1, 8, "failed", 0.0, "permanent", "http_302"),
    ("permanent on the last attempt", err(http_status=404), 8, 8, "failed", 0.0, "permanent", "http_404"),
    ("SSRF guard", err(error_code="destination_forbidden"), 1, 8, "failed", 0.0, "permanent",
     "destination_forbidden"),
    ("provider hint: permanent", err(http_status=503, permanent=True), 1, 8, "failed", 0.0, "permanent", "http_503"),
    ("provider hint: transient", err(http_status=400, permanent=False), 1, 8, "retry", 1.0, "transient", "http_400"),
    ("misconfigured provider", err(error_code="invalid_config", permanent=True), 1, 8, "failed", 0.0, "permanent",
     "invalid_config"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("result", "attempts", "max_attempts", "kind", "delay", "failure_class", "code"),
    [case[1:] for case in DECISIONS],
    ids=[case[0] for case in DECISIONS],
)
def test_decide(result, attempts, max_attempts, kind, delay, failure_class, code):
    decision = policy.decide(result, attempts, max_attempts, RETRY, rng=HALF)
    assert (decision.kind, decision.retry_delay) == (kind, delay)
    assert (decision.verdict.failure_class, decision.verdict.error_code) == (failure_class, code)


def test_the_delivered_fast_path_shares_the_classifiers_verdict():
    assert policy.decide(ok(), 1, 8, RETRY).verdict == policy.DELIVERED_VERDICT


# want, granted by the buckets -> lanes claimed, main lane
SPLITS = [
    (100, {}, {}, 100),
    (100, {1: 0, 2: 0}, {}, 100),
    (100, {1: 30}, {1: 30}, 70),
    (100, {1: 30, 2: 0, 3: 20}, {1: 30, 3: 20}, 50),
    (100, {1: 100}, {1: 100}, 0),
    (10, {1: 8, 2: 8}, {1: 8, 2: 8}, 0),  # lanes may ask more than the claim: never a negative main
    (0, {1: 5}, {1: 5}, 0),
]


@pytest.mark.parametrize(("want", "granted", "lanes", "main"), SPLITS)
def test_split_claim(want, granted, lanes, main):
    assert policy.split_claim(want, granted) == (lanes, main)


# lanes granted, claimed items (provider, rate_limited) -> tokens unused
UNUSED = [
    ({1: 3}, [(1, True)] * 3, {1: 0}),
    ({1: 3}, [(1, True)], {1: 2}),
    ({1: 3, 2: 2}, [(1, True), (2, True), (2, True)], {1: 2, 2: 0}),
    ({1: 3}, [(1, False)] * 3, {1: 3}),  # unlimited items of the same provider came from the main lane
    ({1: 3}, [(None, True), (2, True)], {1: 3}),
    ({}, [(1, True)], {}),
]


@pytest.mark.parametrize(("lanes", "claimed", "unused"), UNUSED)
def test_unused_grants(lanes, claimed, unused):
    assert policy.unused_grants(lanes, claimed) == unused


@pytest.mark.parametrize(("lanes", "want", "asks"), [([1, 2], 50, {1: 50, 2: 50}), ([], 50, {}), ([1], 0, {})])
def test_lane_asks(lanes, want, asks):
    assert policy.lane_asks(lanes, want) == asks
