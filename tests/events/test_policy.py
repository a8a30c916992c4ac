"""dispatch.policy.decide_event: what becomes of an event delivery's result (a table of cases)."""

from __future__ import annotations

import pytest

from dispatch.policy import decide_event
from dlq.retry import RetryPolicy
from providers.kinds.base import DeliveryResult

RETRY = RetryPolicy(base=2, cap=3600)


@pytest.mark.parametrize(
    ("result", "attempt", "kind", "delay"),
    [
        (DeliveryResult(delivered=True, http_status=200), 1, "delivered", 0.0),
        (DeliveryResult(delivered=False, http_status=503, error_code="http_503"), 1, "retry", 2.0),
        (DeliveryResult(delivered=False, http_status=503, error_code="http_503"), 3, "retry", 8.0),
        # no attempt budget: only the endpoint's failing time ends the retries
        (DeliveryResult(delivered=False, http_status=500, error_code="http_500"), 40, "retry", 3600.0),
        (DeliveryResult(delivered=False, http_status=429, retry_after=120, error_code="http_429"), 1, "retry", 120.0),
        (DeliveryResult(delivered=False, error_code="timeout"), 2, "retry", 4.0),
        (DeliveryResult(delivered=False, http_status=404, error_code="http_404"), 1, "failed", 0.0),
        (DeliveryResult(delivered=False, http_status=301, error_code="redirect", permanent=True), 1, "failed", 0.0),
        (DeliveryResult(delivered=False, error_code="destination_forbidden", permanent=True), 1, "failed", 0.0),
    ],
)
def test_decide_event(result, attempt, kind, delay):
    decision = decide_event(result, attempt, RETRY, rng=lambda: 0.999999)
    assert decision.kind == kind
    assert decision.retry_delay == pytest.approx(delay, rel=1e-3)
