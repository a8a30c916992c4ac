"""A revoked API key is refused by every web process within a second, while verified keys are
served from each process's cache (core.auth_cache): two real gunicorn processes on loopback ports."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest
from django.core.management import call_command
from django.db import connection

from core.models import ApiKey
from tests.support import web

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def two_servers(subprocess_env: dict[str, str]) -> Iterator[list[str]]:
    env = {**subprocess_env, "OMNIPOST_AUTH_LISTEN": "true", "CONN_MAX_AGE": "60"}
    with ExitStack() as stack:
        yield [stack.enter_context(web.gunicorn(env, web.SYNC)).url for _ in range(2)]


def status(url: str, raw_key: str) -> int:
    return httpx.get(f"{url}/api/v1/tenant", headers={"Authorization": f"Bearer {raw_key}"}, timeout=5).status_code


def listeners() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'omnipost-auth-listen-%%' "
            "AND datname = current_database() AND query LIKE 'LISTEN%%'"
        )
        return cursor.fetchone()[0]


def test_a_revoked_key_is_refused_by_every_process_within_a_second(tenant_a, two_servers):
    revoked, raw = ApiKey.issue(tenant_a, name="to revoke")
    other, other_raw = ApiKey.issue(tenant_a, name="stays")
    for url in two_servers:  # each process verifies both keys once and starts its listener
        assert status(url, raw) == status(url, other_raw) == 200
    deadline = time.monotonic() + 15
    while listeners() < 2:
        assert time.monotonic() < deadline, "the web processes' LISTEN connections did not come up"
        time.sleep(0.05)
    for url in two_servers:  # verified after the listener connected: cached for TTL, not 1 s
        assert status(url, raw) == status(url, other_raw) == 200

    # Served from memory: a change made behind the processes' backs (no NOTIFY) goes unseen.
    ApiKey.objects.filter(pk=other.pk).update(name="renamed")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE api_keys SET revoked_at = now() WHERE id = %s", [other.pk])
    assert [status(url, other_raw) for url in two_servers] == [200, 200]

    started = time.monotonic()
    call_command("revoke_api_key", revoked.prefix)
    refused: dict[str, float] = {}
    while len(refused) < 2 and time.monotonic() - started < 3:
        for url in two_servers:
            if url not in refused and status(url, raw) == 401:
                refused[url] = time.monotonic() - started
        time.sleep(0.01)
    assert set(refused) == set(two_servers), refused
    assert max(refused.values()) < 1.0, refused
    assert [status(url, raw) for url in two_servers] == [401, 401]
    assert [status(url, other_raw) for url in two_servers] == [200, 200]  # only what was named is dropped
