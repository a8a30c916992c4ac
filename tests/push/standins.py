"""The push vendors' loopback stand-ins live in benchmarks.push_standins (the chaos soak runs them
too, and benchmarks may not import from tests); the push tests import them from here as before."""

from __future__ import annotations

from benchmarks.push_standins import (  # noqa: F401 - re-exported
    Answer,
    ApnsStandIn,
    AsgiServer,
    FcmStandIn,
    GoawayApnsStandIn,
    JwtRefused,
    Subscription,
    WebPushStandIn,
    b64url,
    b64url_decode,
    verify_jwt,
)
