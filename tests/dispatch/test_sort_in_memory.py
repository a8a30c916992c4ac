"""What follows a claim made on the doorbell thread is done from memory only when it needs no
statement (dispatch.claims.Claimer.sort_in_memory); anything else goes to the DB thread's `sort`:
a suppression to look for, a stale routing snapshot, a breaker not closed, a push, a provider not
cached, edited since, or deleted (its version None: the DB thread's load drops it from the cache)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from dispatch.claims import Claimer, ClaimResult
from dispatch.delivery import ClaimSeen
from dispatch.providers import CachedProvider, ProviderCache
from routing.failover import REFRESH_SECONDS, Router

LOADED = datetime(2026, 12, 7, tzinfo=UTC)


def setup(now: list[float]) -> tuple[Claimer, list]:  # noqa: ANN001
    clock = lambda: now[0]  # noqa: E731
    cache = ProviderCache(clock, size=4)
    cache.entries[7] = CachedProvider(instance=None, row_updated_at=LOADED, max_attempts=3, limited=False)  # type: ignore[arg-type]
    router = Router(clock)
    router._refreshed = now[0]
    claimer = Claimer(None, 30.0, cache, clock, router)
    items = [SimpleNamespace(provider_id=7, channel="webhook"), SimpleNamespace(provider_id=7, channel="email")]
    return claimer, items


def seen(version: datetime | None = LOADED, check: bool = False) -> ClaimSeen:
    return ClaimSeen(versions={7: version}, check_suppressions=check)


def test_a_claim_that_needs_no_statement_is_sorted_from_memory():
    claimer, items = setup([100.0])
    result = claimer.sort_in_memory(items, seen())
    assert isinstance(result, ClaimResult) and result.send == items
    assert list(claimer.providers.entries) == [7]


@pytest.mark.parametrize(
    "change",
    ["suppressions", "stale-routing", "breaker", "push", "not-cached", "edited", "deleted"],
)
def test_anything_that_needs_the_database_goes_to_the_db_thread(change):
    now = [100.0]
    claimer, items = setup(now)
    what = seen()
    if change == "suppressions":
        what = seen(check=True)
    elif change == "stale-routing":
        now[0] += REFRESH_SECONDS
    elif change == "breaker":
        claimer.router.states = {9: "open"}
    elif change == "push":
        items[1].channel = "push"
    elif change == "not-cached":
        items[1].provider_id = 8
    elif change == "edited":
        what = seen(LOADED + timedelta(seconds=1))
    elif change == "deleted":
        what = seen(None)
    assert claimer.sort_in_memory(items, what) is None
    assert list(claimer.providers.entries) == [7], "the cache is changed only by the DB thread"
