"""The breaker's rule (routing.breaker) as a table of cases, and the record statement's SQL of it
(routing.circuits: `considered_sql`, `transition_ctes`, `NEXT_ROW`, `state_sql`) run over the same
table on PostgreSQL: both give every case the same step and the same row."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction

from providers.circuit import settings_of
from routing import circuits
from routing.breaker import CLOSE, KEEP, OPEN_STEP, REOPEN, ROLL, Batch, Row, Settings, considered, state_of, transition

pytestmark = pytest.mark.django_db

SETTINGS = {"failure_threshold": 0.5, "min_requests": 4, "window_seconds": 60, "open_seconds": 30}


def ago(seconds: float | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=-seconds)


def closed(started: float | None, base: tuple[int, int] = (0, 0), prev: tuple[int, int] = (0, 0)) -> dict:
    return {"state": "closed", "opened_at": None, "started": started, "base": base, "prev": prev}


def opened(opened: float, started: float = 100.0, base: tuple[int, int] = (50, 30)) -> dict:
    return {"state": "open", "opened_at": opened, "started": started, "base": base, "prev": (0, 0)}


# (case, row (None: none; times in seconds before now), batch (sends, failures, successes),
#  counted before the batch (requests, failures), settings, the step the rule takes)
CASES = [
    ("first failure, no row: the window starts", None, (1, 1, 0), (0, 0), {}, ROLL),
    ("first batch already past the threshold", None, (4, 3, 1), (0, 0), {}, OPEN_STEP),
    ("exactly at the threshold opens", None, (4, 2, 2), (0, 0), {}, OPEN_STEP),
    ("under min_requests stays closed", None, (3, 3, 0), (0, 0), {}, ROLL),
    ("no failure, closed: not looked at", closed(10, (100, 10)), (5, 0, 5), (100, 10), {}, KEEP),
    ("no failure, no row: not looked at", None, (5, 0, 5), (7, 1), {}, KEEP),
    ("in the window, over the threshold", closed(10, (100, 10)), (2, 1, 1), (103, 12), {}, OPEN_STEP),
    ("in the window, under the threshold", closed(10, (100, 10)), (2, 1, 1), (110, 11), {}, KEEP),
    ("a window just ended rolls, its counts become prev", closed(70, (100, 10)), (1, 1, 0), (110, 12), {}, ROLL),
    ("prev slides in: a full share just after the roll", closed(70, (100, 10)), (2, 2, 0), (104, 13), {}, OPEN_STEP),
    ("a window that ended long ago is forgotten", closed(200, (100, 10)), (3, 3, 0), (200, 150), {}, ROLL),
    ("... and the batch alone can open it", closed(200, (100, 10)), (4, 4, 0), (200, 150), {}, OPEN_STEP),
    ("exactly one window old rolls", closed(60, (100, 10)), (1, 1, 0), (101, 11), {}, ROLL),
    ("a row without a window start rolls", closed(None, (5, 5)), (1, 1, 0), (9, 6), {}, ROLL),
    ("open, not yet half-open: kept", opened(10), (3, 3, 0), (60, 35), {}, KEEP),
    ("open with only successes, not yet half-open: kept", opened(10), (2, 0, 2), (60, 35), {}, KEEP),
    ("half-open, a failure re-opens", opened(40), (1, 1, 0), (60, 35), {}, REOPEN),
    ("half-open, failure and success: re-opens", opened(40), (2, 1, 1), (60, 35), {}, REOPEN),
    ("half-open, a success closes", opened(40), (1, 0, 1), (60, 35), {}, CLOSE),
    ("half-open, only permanent errors: kept", opened(40), (1, 0, 0), (60, 35), {}, KEEP),
    ("exactly open_seconds after opening is half-open", opened(30), (1, 0, 1), (60, 35), {}, CLOSE),
    ("a stricter threshold keeps it closed", None, (4, 3, 1), (0, 0), {"failure_threshold": 0.8}, ROLL),
    ("a shorter window has rolled: its counts slide in", closed(7, (100, 10)), (2, 1, 1), (103, 12),
     {"window_seconds": 5}, OPEN_STEP),
    ("two shorter windows ago: forgotten", closed(10, (100, 10)), (2, 1, 1), (103, 12), {"window_seconds": 5}, ROLL),
]  # fmt: skip


def _row(spec: dict | None, now: datetime) -> Row | None:
    if spec is None:
        return None
    started = None if spec["started"] is None else now + ago(spec["started"])
    opened_at = None if spec["opened_at"] is None else now + ago(spec["opened_at"])
    return Row(spec["state"], opened_at, started, *spec["base"], *spec["prev"])


def _settings(extra: dict) -> tuple[dict, Settings]:
    chosen = settings_of({**SETTINGS, **extra})
    return chosen, Settings(**chosen)


def _now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


@pytest.mark.parametrize(("case", "row", "batch", "counted", "extra", "step"), CASES, ids=[c[0] for c in CASES])
def test_the_rule_takes_the_step_of_its_table(case, row, batch, counted, extra, step):
    now = datetime(2030, 1, 1, 12, 0, 0).astimezone()
    taken, written = transition(_row(row, now), Batch(*batch), counted, _settings(extra)[1], now)
    assert taken == step
    assert (written is None) == (step == KEEP)
    if step in (OPEN_STEP, REOPEN):
        assert (written.state, written.opened_at) == ("open", now)
    if step == CLOSE:
        assert written == Row("closed", None, now, counted[0] + batch[0], counted[1] + batch[1], 0, 0)


def test_a_roll_keeps_what_the_ended_window_counted():
    now = datetime(2030, 1, 1, 12, 0, 0).astimezone()
    step, written = transition(_row(closed(70, (100, 10)), now), Batch(1, 1, 0), (110, 12), _settings({})[1], now)
    assert step == ROLL
    assert written == Row("closed", None, now, 110, 12, 10, 2)
    step, written = transition(_row(closed(200, (100, 10)), now), Batch(1, 1, 0), (110, 12), _settings({})[1], now)
    assert written == Row("closed", None, now, 110, 12, 0, 0)


SEEN_COLUMNS = (
    "provider_id", "sends", "failures", "successes", "has_row", "state", "opened_at", "window_started_at",
    "base_requests", "base_failures", "prev_requests", "prev_failures", "threshold", "min_requests",
    "window_seconds", "open_seconds", "total_requests", "total_failures",
)  # fmt: skip
SEEN_TYPES = (
    "bigint", "bigint", "bigint", "bigint", "boolean", "text", "timestamptz", "timestamptz", "bigint", "bigint",
    "bigint", "bigint", "float8", "float8", "float8", "float8", "numeric", "numeric",
)  # fmt: skip


def _as_row(values: tuple) -> Row:
    state, opened_at, _, started, *counts = values
    return Row(state, opened_at, started, *(int(Decimal(c)) for c in counts))


def test_the_record_statements_sql_takes_the_same_steps_and_writes_the_same_rows():
    with transaction.atomic():
        now = _now()  # the transaction's now(), which the SQL reads too
        expected, values, params = {}, [], []
        for number, (_, spec, batch, counted, extra, _) in enumerate(CASES, start=1):
            row, (chosen, settings) = _row(spec, now), _settings(extra)
            if not considered(row, Batch(*batch)):
                continue  # the statement's circuit_seen leaves these out (test_the_filter_is_the_rules)
            expected[number] = transition(row, Batch(*batch), counted, settings, now)
            current = row or Row()
            values.append("(" + ", ".join(f"%s::{t}" for t in SEEN_TYPES) + ")")
            params += [
                number, *batch, row is not None, current.state, current.opened_at, current.window_started_at,
                current.base_requests, current.base_failures, current.prev_requests, current.prev_failures,
                chosen["failure_threshold"], chosen["min_requests"], chosen["window_seconds"], chosen["open_seconds"],
                counted[0] + batch[0], counted[1] + batch[1],
            ]  # fmt: skip
        columns = ", ".join(sql for _, sql in circuits.NEXT_ROW)
        sql = (
            f"WITH circuit_seen AS (SELECT * FROM (VALUES {', '.join(values)}) AS v({', '.join(SEEN_COLUMNS)})), "
            f"{circuits.transition_ctes('circuit_seen')} "
            f"SELECT n.provider_id, n.step, {columns} FROM circuit_next n ORDER BY n.provider_id"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            found = {number: (step, None if step == KEEP else _as_row(rest[:-1]))
                     for number, step, *rest in cursor.fetchall()}  # fmt: skip
    assert len(found) >= 18
    assert found == expected


def test_the_filter_is_the_rules():
    rows = [(failures, state) for failures in (0, 1, 3) for state in (None, "closed", "open")]
    sql = f"SELECT {circuits.considered_sql('v.failures', 'v.state')} FROM (VALUES %s) AS v(failures, state)"
    with connection.cursor() as cursor:
        for failures, state in rows:
            cursor.execute(sql.replace("%s", "(%s::bigint, %s::text)"), [failures, state])
            row = None if state is None else Row(state, None)
            assert bool(cursor.fetchone()[0]) == considered(row, Batch(failures, failures, 0)), (failures, state)


@pytest.mark.parametrize(
    ("state", "opened", "open_seconds"),
    [(None, None, 30), ("closed", None, 30), ("open", 5, 30), ("open", 30, 30), ("open", 31, 30), ("open", 31, 60),
     ("open", 0.5, 0.4)],
)  # fmt: skip
def test_the_state_read_in_sql_is_the_rules(state, opened, open_seconds):
    with transaction.atomic():
        now = _now()
        opened_at = None if opened is None else now - timedelta(seconds=opened)
        row = None if state is None else Row(state, opened_at)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {circuits.state_sql('p', 'c')} FROM (SELECT %s::jsonb AS circuit) p, "  # noqa: S608
                "(SELECT %s::text AS state, %s::timestamptz AS opened_at) c",
                [json.dumps({"open_seconds": open_seconds}), state, opened_at],
            )
            assert cursor.fetchone()[0] == state_of(row, open_seconds, now)
