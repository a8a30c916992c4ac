"""A create whose COMMIT reached the server but whose reply never came back.

The server has the rows; the client saw no 201. The API answers 503 (it cannot know the outcome)
and says so; the same request retried with the same `Idempotency-Key` finds the stored record and
returns the stored notification, never a second one.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import connections
from django.db.backends.postgresql.base import DatabaseWrapper

from core import hot_sql
from notifications.models import IdempotencyRecord, Notification
from tests.support.setups import email

URL = "/api/v1/notifications"
BATCH = "/api/v1/notifications/batch"
# Every keyed single create here that is a 201, a replay or a 409 is the hot path's (its test of the
# views' answers: tests/notifications/test_api_hot_path.py).
pytestmark = pytest.mark.usefixtures("keyed_creates_on_the_hot_path")


def _lose_reply(wrapper) -> None:  # noqa: ANN001
    wrapper.connection.close()  # the server did the work; the socket is gone before the answer
    with wrapper.wrap_database_errors:
        raise psycopg.OperationalError("server closed the connection unexpectedly")


@pytest.fixture
def lose_next_commit_reply(monkeypatch):  # noqa: ANN001, ANN201
    """The commit that stores the first notification is carried out by the server, then the session
    dies before its reply reaches the web process: the reply of the COMMIT of a transaction, or of
    the statement itself when it runs on its own (a create is one statement)."""
    original = DatabaseWrapper._commit
    lost: list[bool] = []

    def commit_then_lose_reply(self):  # noqa: ANN001, ANN202
        original(self)
        if lost:
            return
        stored = self.connection.execute("SELECT EXISTS (SELECT FROM notifications)").fetchone()[0]
        self.connection.rollback()  # the probe's own transaction
        if stored:
            lost.append(True)
            _lose_reply(self)

    fetchone = hot_sql.fetchone

    def statement_then_lose_reply(sql, params, *, using="default"):  # noqa: ANN001, ANN202
        row = fetchone(sql, params, using=using)
        wrapper = connections[using]
        if not lost and wrapper.get_autocommit() and "INSERT INTO notifications" in sql:
            lost.append(True)
            _lose_reply(wrapper)
        return row

    monkeypatch.setattr(DatabaseWrapper, "_commit", commit_then_lose_reply)
    monkeypatch.setattr(hot_sql, "fetchone", statement_then_lose_reply)
    return lost


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("url", "body"), [(URL, email()), (BATCH, {"notifications": [email(), email()]})])
def test_retry_with_the_same_key_returns_what_the_lost_reply_would_have(api_a, setup_a, lose_next_commit_reply,
                                                                        url, body):  # fmt: skip
    lost = api_a.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="lost-reply-1")
    assert lose_next_commit_reply == [True]
    assert lost.status_code == 503, lost.content
    assert lost["Retry-After"]
    error = lost.json()["error"]
    assert error["code"] == "unavailable"
    assert "Idempotency-Key" in error["message"]  # it does not claim that nothing was stored
    stored = list(Notification.objects.values_list("id", flat=True))
    assert stored  # the commit happened

    retried = api_a.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="lost-reply-1")
    assert retried.status_code in (200, 201, 202), retried.content
    assert retried["Idempotent-Replayed"] == "true"
    data = retried.json()
    ids = [n["id"] for n in data["results"]] if "results" in data else [data["id"]]
    assert sorted(ids) == sorted(str(i) for i in stored)
    assert Notification.objects.count() == len(stored)  # no second notification
    assert IdempotencyRecord.objects.get().state == "completed"
