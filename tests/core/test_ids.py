"""core.ids.uuid7: RFC 9562 version 7 UUIDs that sort in the order they were made."""

from __future__ import annotations

import uuid

from core.ids import uuid7

AT = 1_796_112_000_123_456_789  # ns since the epoch: 2026-12-01 + 123.456789 ms


def test_layout_follows_rfc_9562():
    u = uuid7(AT)
    assert u.version == 7
    assert u.variant == uuid.RFC_4122
    assert u.int >> 80 == AT // 1_000_000  # the top 48 bits: Unix milliseconds
    assert (u.int >> 64) & 0xFFF == (AT % 1_000_000) * 4096 // 1_000_000  # the millisecond's fraction


def test_later_ids_sort_after_earlier_ones_even_within_a_millisecond():
    ids = [uuid7(AT + step * 250) for step in range(4000)]  # 4,000 ids 250 ns apart (1 ms in all)
    assert ids == sorted(ids)
    assert str(ids[0]) < str(ids[-1])  # as text too (the API's ids)


def test_ids_made_at_the_same_instant_differ():
    assert len({uuid7(AT) for _ in range(10_000)}) == 10_000


def test_ids_made_one_after_another_sort_in_order():
    ids = [uuid7() for _ in range(5000)]
    assert ids == sorted(ids)
