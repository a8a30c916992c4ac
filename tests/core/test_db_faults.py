"""core.db_faults: which errors mean "reconnect and go on", and the backoff between tries."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, IntegrityError, connection
from django.db import InterfaceError as DjangoInterfaceError
from django.db import OperationalError as DjangoOperationalError
from psycopg import errors as pg_errors

from core import db_faults
from core.db_faults import Backoff, is_connection_lost


def _wrapped(cause: BaseException, outer: type[BaseException]) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise outer(str(exc)) from exc
    except BaseException as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"), True),
        (pg_errors.AdminShutdown("terminating connection due to administrator command"), True),
        (psycopg.InterfaceError("the connection is closed"), True),
        (DjangoOperationalError("connection failed"), True),
        (DjangoInterfaceError("connection already closed"), True),
        (_wrapped(pg_errors.AdminShutdown("terminating"), DatabaseError), True),  # Django's wrapper of psycopg's
        (pg_errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"), True),  # a standby
        (pg_errors.IdleInTransactionSessionTimeout("idle in transaction timeout"), True),
        (pg_errors.TooManyConnections("too many clients"), True),
        (pg_errors.UniqueViolation("duplicate key"), False),
        (IntegrityError("duplicate key"), False),
        (pg_errors.SyntaxError("syntax error"), False),
        (ValueError("not a database error"), False),
        (KeyError("provider"), False),
    ],
)
def test_which_errors_mean_a_lost_session(error, lost):
    assert is_connection_lost(error) is lost


def test_backoff_grows_with_jitter_up_to_its_cap_and_resets():
    backoff = Backoff(first=0.1, cap=1.0)
    delays = [backoff.next() for _ in range(8)]
    assert 0.05 <= delays[0] <= 0.1
    assert all(0.5 <= d <= 1.0 for d in delays[4:])  # 0.1·2⁴ is past the cap
    assert backoff.failing
    backoff.reset()
    assert not backoff.failing and backoff.next() <= 0.1


@pytest.mark.django_db(transaction=True)
def test_a_terminated_session_is_reset_and_the_next_query_reconnects():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with psycopg.connect(
        host=connection.settings_dict["HOST"], port=connection.settings_dict["PORT"],
        user=connection.settings_dict["USER"], dbname=connection.settings_dict["NAME"], autocommit=True,
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(Exception) as raised, connection.cursor() as cursor:  # noqa: PT011 - any driver error
        cursor.execute("SELECT 1")
    assert is_connection_lost(raised.value)
    before = db_faults.reconnects()
    db_faults.reset_connection()
    assert db_faults.reconnects() == before + 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid


@pytest.mark.parametrize(
    "error",
    [
        _wrapped(pg_errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"), DatabaseError),
        DjangoOperationalError("connection failed: Multiple connection attempts failed"),
    ],
)
def test_the_api_answers_a_lost_database_503_unavailable_with_retry_after(error):
    from core.api.errors import exception_handler

    response = exception_handler(error, {})
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert response.data["error"]["code"] == "unavailable"


def test_other_database_errors_stay_the_handlers_500():
    from core.api.errors import exception_handler

    assert exception_handler(_wrapped(pg_errors.UniqueViolation("duplicate key"), IntegrityError), {}) is None
