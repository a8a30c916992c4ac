"""The dispatcher's decisions as pure functions of data (STYLE 4b), each with a table test
(tests/dispatch/test_policy.py): what becomes of a send's result, and how a claim is split
between rate-limited lanes and the main lane."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dlq.classifier import Classification, classify
from dlq.retry import RetryPolicy, exhausted
from providers.kinds.base import DeliveryResult

DELIVERED, RETRY, FAILED, DEAD_LETTERED = "delivered", "retry", "failed", "dead_lettered"


@dataclass(frozen=True, slots=True)
class Decision:
    kind: str  # delivered | retry | failed | dead_lettered
    verdict: Classification
    retry_delay: float = 0.0  # seconds, for a retry


def decide(
    result: DeliveryResult,
    attempts_this_run: int,
    max_attempts: int,
    retry: RetryPolicy,
    rng: Callable[[], float] = random.random,
) -> Decision:
    """Delivered; a permanent failure fails; a transient one retries after the policy's backoff
    (honouring Retry-After) until `attempts_this_run` (tries since the last redrive, this one
    included) uses up `max_attempts`, then it is dead-lettered."""
    verdict = classify(result)
    if verdict.delivered:
        return Decision(DELIVERED, verdict)
    if verdict.permanent:
        return Decision(FAILED, verdict)
    if exhausted(attempts_this_run, max_attempts):
        return Decision(DEAD_LETTERED, verdict)
    return Decision(RETRY, verdict, retry.delay(attempts_this_run, verdict.retry_after, rng))


def lane_asks(lanes: Iterable[int], want: int) -> dict[int, int]:
    """Tokens to ask of each rate-limited lane: a whole claim's worth each (the grant caps it)."""
    return {provider_id: want for provider_id in lanes} if want > 0 else {}


def split_claim(want: int, granted: Mapping[int, int]) -> tuple[dict[int, int], int]:
    """The lanes that got tokens (with how many) and what is left for the main (unlimited) lane."""
    lanes = {provider_id: n for provider_id, n in granted.items() if n > 0}
    return lanes, max(0, want - sum(lanes.values()))


def unused_grants(lanes: Mapping[int, int], claimed: Iterable[tuple[int | None, bool]]) -> dict[int, int]:
    """Tokens each lane was granted but did not use, from the claimed items' (provider_id,
    rate_limited): given back to the buckets; a lane left with unused tokens ran dry."""
    used: dict[int, int] = {}
    for provider_id, rate_limited in claimed:
        if rate_limited and provider_id is not None:
            used[provider_id] = used.get(provider_id, 0) + 1
    return {provider_id: n - used.get(provider_id, 0) for provider_id, n in lanes.items()}


DELIVERED_VERDICT = classify(DeliveryResult(delivered=True))  # the classifier's, for the delivered fast path


def decide_event(
    result: DeliveryResult, attempt: int, retry: RetryPolicy, rng: Callable[[], float] = random.random
) -> Decision:
    """An event delivery to a tenant's endpoint: delivered; a permanent failure (3xx, other 4xx,
    destination_forbidden) fails; a transient one retries after the notifications' backoff (Retry-After
    honoured) with no attempt budget: the endpoint's failing time ends the retries, by disabling
    it (events.deliveries)."""
    verdict = classify(result)
    if verdict.delivered:
        return Decision(DELIVERED, verdict)
    if verdict.permanent:
        return Decision(FAILED, verdict)
    return Decision(RETRY, verdict, retry.delay(attempt, verdict.retry_after, rng))
