"""Fixtures of the push tests that run dispatchers against the vendors' stand-ins."""

from __future__ import annotations

import pytest

from tests.push.standins import ApnsStandIn, FcmStandIn, WebPushStandIn


@pytest.fixture
def standins(tmp_path):
    """One stand-in of each vendor (APNs, FCM, Web Push), running on loopback."""
    apns, fcm, webpush = ApnsStandIn(tmp_path).start(), FcmStandIn().start(), WebPushStandIn().start()
    yield apns, fcm, webpush
    for standin in (apns, fcm, webpush):
        standin.stop()


@pytest.fixture
def push_env(subprocess_env):
    """The dispatchers' environment: short backoffs and leases, so that retries come within a test."""
    return {**subprocess_env, "OMNIPOST_RETRY_BASE_SECONDS": "0.2", "OMNIPOST_RETRY_MAX_SECONDS": "0.5",
            "OMNIPOST_LEASE_SECONDS": "3"}  # fmt: skip
