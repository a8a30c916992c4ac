"""queueing.ratelimit.take_key, the one-bucket take behind the API's and the receipts' throttles: on
PostgreSQL one statement, its row locked for that statement only, exact under concurrent takers."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from queueing.models import RateBucket
from queueing.ratelimit import take_key

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_takers_are_granted_exactly_the_burst():
    granted: list[int] = []
    lock = threading.Lock()

    def taker() -> None:
        try:
            for _ in range(20):
                n, _wait = take_key("test:burst", 0.001, 50, 3)
                with lock:
                    granted.append(n)
        finally:
            connection.close()

    threads = [threading.Thread(target=taker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert sum(granted) == 50 and len(granted) == 160  # 160 takes of up to 3 from a burst of 50, none refilled
    assert 0 <= RateBucket.objects.get(key="test:burst").tokens < 1


def test_a_short_take_says_when_the_next_token_comes_and_a_new_configuration_caps_the_bucket():
    assert take_key("test:wait", 2.0, 10, 8) == (8, None)
    n, wait = take_key("test:wait", 2.0, 10, 8)
    assert n == 2 and 0.4 < wait <= 0.5  # (1 - tokens) / 2 per second, tokens refilled a few ms' worth
    RateBucket.objects.filter(key="test:wait").update(tokens=10)
    n, _ = take_key("test:wait", 1.0, 4, 100)  # burst lowered to 4: the 10 held are capped first
    bucket = RateBucket.objects.get(key="test:wait")
    assert n == 4 and (bucket.rate, bucket.burst, bucket.effective_rate) == (1.0, 4.0, 1.0)


def test_the_bucket_refills_from_the_databases_clock_and_never_past_its_burst():
    assert take_key("test:refill", 1000.0, 5, 5)[0] == 5
    with connection.cursor() as cursor:
        cursor.execute("UPDATE rate_limit_buckets SET updated_at = clock_timestamp() - interval '1 hour' "
                       "WHERE key = 'test:refill'")
    assert take_key("test:refill", 1000.0, 5, 100)[0] == 5
    with connection.cursor() as cursor:  # a peer's clock ahead of ours: no refill, the clock kept
        cursor.execute("UPDATE rate_limit_buckets SET tokens = 0, updated_at = clock_timestamp() + interval '1 hour' "
                       "WHERE key = 'test:refill'")
    assert take_key("test:refill", 1000.0, 5, 1)[0] == 0
