"""The doorbell ringer (queueing.ringer): the NOTIFYs of committed work, sent from one thread and
connection per process, coalesced, kept across a lost connection and sent before the process exits."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection, transaction

from core import pooling
from queueing import ringer
from queueing.queue import NOTIFY_CHANNEL, ring_after_commit
from queueing.schedule import SCHEDULE_CHANNEL
from queueing.wakeup import _conninfo
from tests.core.conftest import REPO

pytestmark = pytest.mark.django_db(transaction=True)


class Listener:
    """A real LISTEN connection on the test database."""

    def __init__(self, *channels: str) -> None:
        self.conn = psycopg.connect(**_conninfo("default", "omnipost-test-ringer"))
        for channel in channels:
            self.conn.execute(f"LISTEN {channel}")

    def received(self, count: int, timeout: float = 5.0) -> list[tuple[str, str]]:
        """The first `count` notifications (fewer if `timeout` passes), then whatever else comes in 0.2 s."""
        got: list[tuple[str, str]] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            got += [(n.channel, n.payload) for n in self.conn.notifies(timeout=0.1, stop_after=count - len(got))]
        got += [(n.channel, n.payload) for n in self.conn.notifies(timeout=0.2)]
        return got

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def listener():  # noqa: ANN201
    found = Listener(NOTIFY_CHANNEL, SCHEDULE_CHANNEL)
    yield found
    found.close()


@pytest.fixture
def fresh():  # noqa: ANN201
    """A ringer of the test's own, closed afterwards."""
    made: list[ringer.Ringer] = []

    def make(linger: float = ringer.LINGER) -> ringer.Ringer:
        made.append(ringer.Ringer("default", linger=linger))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_a_ring_after_commit_reaches_a_listener_and_a_rolled_back_one_does_not(listener):
    with transaction.atomic():
        ring_after_commit(NOTIFY_CHANNEL, "rolled-back")
        transaction.set_rollback(True)
    with transaction.atomic():
        ring_after_commit(NOTIFY_CHANNEL, "default")
        with connection.cursor() as cursor:  # not yet: the ring waits for the commit
            cursor.execute("SELECT 1")
        assert listener.received(1, timeout=0.3) == []
    assert listener.received(1) == [(NOTIFY_CHANNEL, "default")]
    assert ringer.ringer().flush(5)


def test_rings_coalesce_into_one_statement_per_distinct_payload(listener, fresh):
    bell = fresh(linger=0.3)
    bell.ring(NOTIFY_CHANNEL, "first")  # sent at once: the ringer had sent nothing for a while
    assert bell.flush(5) and bell.statements == 1
    for _ in range(200):  # within the linger: one statement for all of them
        bell.ring(NOTIFY_CHANNEL, "default")
        bell.ring(NOTIFY_CHANNEL, "bulk,default")
    assert bell.flush(5) and bell.statements == 2
    assert sorted(listener.received(3)) == [(NOTIFY_CHANNEL, "bulk,default"), (NOTIFY_CHANNEL, "default"),
                                            (NOTIFY_CHANNEL, "first")]  # fmt: skip


def test_the_schedulers_get_the_earliest_run_at_of_what_was_rung_together(listener, fresh):
    bell = fresh(linger=0.3)
    bell.ring(NOTIFY_CHANNEL, "default")
    assert bell.flush(5)
    listener.received(1)
    base = datetime(2030, 1, 1, 12, tzinfo=UTC)
    times = [base + timedelta(minutes=m) for m in (30, 5, 45)]
    for when in times:
        bell.ring(SCHEDULE_CHANNEL, when.isoformat())
    # another offset, earlier in fact though later as text
    bell.ring(SCHEDULE_CHANNEL, (base + timedelta(minutes=1)).astimezone(ringer_tz(-5)).isoformat())
    assert bell.flush(5)
    (channel, payload), *rest = listener.received(1)
    assert channel == SCHEDULE_CHANNEL and datetime.fromisoformat(payload) == base + timedelta(minutes=1)
    assert rest == []


def ringer_tz(hours: int):  # noqa: ANN201
    from datetime import timezone

    return timezone(timedelta(hours=hours))


def test_a_terminated_connection_loses_no_ring(listener, fresh):
    bell = fresh(linger=0.0)
    bell.ring(NOTIFY_CHANNEL, "before")
    assert bell.flush(5) and listener.received(1) == [(NOTIFY_CHANNEL, "before")]
    killed = bell.backend_pid
    with psycopg.connect(**_conninfo("default", "omnipost-test-killer")) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [killed]).fetchone()[0]
    bell.ring(NOTIFY_CHANNEL, "after")
    assert bell.flush(10)
    assert listener.received(1) == [(NOTIFY_CHANNEL, "after")]
    assert bell.backend_pid != killed


def test_rings_wait_out_an_unreachable_database_and_go_when_it_is_back(listener, fresh):
    bell = fresh(linger=0.0)
    good = pooling.notify_params("default")
    bell._params = {**good, "port": 1}  # nothing listens there: every connect fails
    bell.ring(NOTIFY_CHANNEL, "held")
    assert not bell.flush(0.5)  # kept, retried with backoff
    assert listener.received(1, timeout=0.2) == []
    bell._params = good
    assert bell.flush(10)
    assert listener.received(1) == [(NOTIFY_CHANNEL, "held")]


def test_a_process_that_exits_right_after_its_commit_still_rings(listener, subprocess_env):
    script = (
        "import django; django.setup()\n"
        "from django.db import transaction\n"
        "from queueing.queue import ring_after_commit\n"
        "with transaction.atomic():\n"
        "    ring_after_commit('omnipost_queue', 'from-a-short-process')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=subprocess_env, timeout=120,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert listener.received(1) == [(NOTIFY_CHANNEL, "from-a-short-process")]



def test_behind_pgbouncer_the_rings_go_through_the_pooler_unprepared(listener, fresh):
    """In transaction pooling consecutive statements may run on different server connections: the
    ringer prepares nothing there, and every ring reaches a listener on the direct server."""
    from django.test import override_settings

    from tests.support.pgbouncer import PrivatePgBouncer

    db = connection.settings_dict
    server = f"postgres://{db['USER']}:{db.get('PASSWORD') or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    with PrivatePgBouncer(server, pool_size=2) as bouncer, override_settings(OMNIPOST_DATABASE_POOLER="pgbouncer"):
        bell = fresh(linger=0.0)
        bell._params = {"conninfo": bouncer.url(db["NAME"]), "autocommit": True, "connect_timeout": 10}
        for n in range(5):
            bell.ring(NOTIFY_CHANNEL, f"pooled-{n}")
            assert bell.flush(10)
        assert bell.statements == 5
        assert sorted(listener.received(5)) == [(NOTIFY_CHANNEL, f"pooled-{n}") for n in range(5)]
        clients = [c for c in bouncer.show("CLIENTS") if c["database"] == db["NAME"]]
        assert clients, "the ringer's connection is not through the pooler"
