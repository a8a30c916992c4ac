"""CONN_HEALTH_CHECKS' `SELECT 1` only for a connection idle past OMNIPOST_CONN_CHECK_IDLE_SECONDS."""

from __future__ import annotations

import pytest
from django.db import connections

from core import conn_checks

pytestmark = pytest.mark.django_db


@pytest.fixture
def checks(monkeypatch, settings):  # noqa: ANN001, ANN201
    """Count the health checks a request start would run (Django's own sequence, signals aside)."""
    settings.OMNIPOST_CONN_CHECK_IDLE_SECONDS = 1.0
    connection = connections["default"]  # the wrapper itself, not the proxy, for monkeypatch
    connection.ensure_connection()
    calls: list[int] = []
    monkeypatch.setattr(connection, "health_check_enabled", True)
    monkeypatch.delattr(connection, conn_checks._ATTR, raising=False)  # a request of an earlier test
    monkeypatch.setattr(connection, "is_usable", lambda: calls.append(1) or True)
    now = [1000.0]
    monkeypatch.setattr(conn_checks.time, "monotonic", lambda: now[0])

    def request(after_idle: float) -> int:
        before = len(calls)
        now[0] += after_idle
        connection.health_check_done = False  # what close_old_connections does at every request start
        conn_checks._started()
        connection.close_if_health_check_failed()  # what the request's first query does
        conn_checks._finished()
        return len(calls) - before

    return request


def test_a_busy_connection_is_not_checked_an_idle_one_is(checks):
    assert checks(after_idle=0.0) == 1  # never used by a request yet
    assert checks(after_idle=0.2) == 0
    assert checks(after_idle=0.9) == 0
    assert checks(after_idle=1.5) == 1  # idle long enough to have been cut off meanwhile


def test_after_a_database_error_the_check_runs(checks, monkeypatch):
    checks(after_idle=0.0)
    monkeypatch.setattr(connections["default"], "errors_occurred", True)
    assert checks(after_idle=0.1) == 1


def test_zero_keeps_djangos_check_before_every_request(checks, settings):
    settings.OMNIPOST_CONN_CHECK_IDLE_SECONDS = 0
    assert [checks(after_idle=0.1) for _ in range(3)] == [1, 1, 1]
