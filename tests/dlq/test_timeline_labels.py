"""What each attempt of a dead-letter entry's timeline is labelled: a transient error led to a retry, except
the notification's last attempt when none came (it was dead-lettered, failed or cancelled)."""

from __future__ import annotations

import pytest

from dlq.admin import attempt_shade


@pytest.mark.parametrize(
    ("outcome", "last", "status", "shade"),
    [
        ("delivered", True, "delivered", "delivered"),
        ("transient_error", False, "dead_lettered", "retrying"),
        ("transient_error", True, "dead_lettered", "dead_lettered"),
        ("transient_error", True, "failed", "failed"),
        ("transient_error", True, "cancelled", "cancelled"),
        ("transient_error", True, "retrying", "retrying"),  # the retry is still to come
        ("transient_error", True, "queued", "retrying"),  # redriven: the next try is queued
        ("permanent_error", True, "failed", "failed"),
        ("permanent_error", False, "delivered", "failed"),
        ("transient_error", True, None, "retrying"),  # the notification was pruned
    ],
)
def test_attempt_shade(outcome: str, last: bool, status: str | None, shade: str) -> None:
    note = None if status is None else {"status": status}
    assert attempt_shade(outcome, last=last, note=note) == shade
