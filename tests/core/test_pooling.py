"""OMNIPOST_DATABASE_POOLER=pgbouncer (core.pooling): nothing prepared
server-side, no session state left behind by the hot path or the janitor, LISTEN only on the direct
OMNIPOST_LISTEN_DATABASE_URL. The same paths with the pooler off do prepare, so the zero counts are
the switch's doing. Real processes through a real PgBouncer: tests/dispatch/test_many_hosts.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from core import auth_cache, pooling
from dispatch.delivery import Attempt, Outcome, claim_and_start, record_outcomes
from dispatch.providers import provider_versions
from queueing.janitor import Janitor, vacuum_if_needed
from queueing.wakeup import Doorbell
from tests.queueing.test_janitor import autocommit_connection, dead_rows, leave_dead_queue_rows
from tests.support.setups import email, make_setup

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


def session_state() -> dict:
    """What this Django connection's server session keeps beyond a transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM pg_prepared_statements), current_setting('plan_cache_mode'), "
            "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())"
        )
        prepared, plan_cache_mode, advisory = cursor.fetchone()
    return {"prepared": prepared, "plan_cache_mode": plan_cache_mode, "advisory_locks": advisory}


def hot_path(api_a, setup) -> None:  # noqa: ANN001
    """The API's create and detail read, then a dispatcher's claim, provider check and record."""
    created = [api_a.post("/api/v1/notifications", email(subject=f"n{i}"), format="json") for i in range(3)]
    assert [r.status_code for r in created] == [201, 201, 201]
    assert api_a.get(f"/api/v1/notifications/{created[0].json()['id']}").status_code == 200
    prepared, skipped = claim_and_start(10, lease_seconds=60)
    assert len(prepared) == 3 and not skipped
    assert set(provider_versions({setup.mail.pk})) == {setup.mail.pk}
    now = timezone.now()
    recorded = record_outcomes([Outcome(p.lease, "delivered", Attempt(p.attempt_number, now, now, "delivered"))
                                for p in prepared])  # fmt: skip
    assert len(recorded.ours) == 3


@pytest.mark.parametrize("pooler", ["none", "pgbouncer"])
def test_the_hot_path_prepares_only_without_a_pooler(api_a, tenant_a, pooler):
    setup = make_setup(tenant_a)
    connection.close()  # a fresh server session: nothing prepared on it yet
    with override_settings(OMNIPOST_DATABASE_POOLER=pooler):
        hot_path(api_a, setup)
        state = session_state()
    if pooler == "pgbouncer":
        assert state == {"prepared": 0, "plan_cache_mode": "auto", "advisory_locks": 0}
    else:  # the create, the detail read, the claim, the provider versions, the record
        assert state["prepared"] >= 4 and state["plan_cache_mode"] == "force_generic_plan"


def test_the_apis_hot_statements_keep_one_generic_plan(api_a, tenant_a):
    """core.hot_sql prepares the create and the detail read once per connection and plans each once:
    every execution runs the generic plan, none is planned again for its parameters."""
    make_setup(tenant_a)

    def plans() -> dict[str, tuple[int, int]]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
            return {statement: (generic, custom) for statement, generic, custom in cursor.fetchall()}

    def hot(found: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        return {("create" if "INSERT INTO notifications" in k else "read"): v for k, v in found.items()
                if "INSERT INTO notifications" in k or (k.lstrip().startswith("SELECT") and "delivery_attempts" in k)}

    assert api_a.post("/api/v1/notifications", email(subject="first"), format="json").status_code == 201
    before = hot(plans())
    created = [api_a.post("/api/v1/notifications", email(subject=f"n{i}"), format="json") for i in range(4)]
    assert [r.status_code for r in created] == [201] * 4
    for response in created:
        assert api_a.get(f"/api/v1/notifications/{response.json()['id']}").status_code == 200
    after = hot(plans())
    assert set(after) == {"create", "read"}, after
    create_before = before.get("create", (0, 0))
    read_before = before.get("read", (0, 0))
    assert (after["create"][0] - create_before[0], after["create"][1] - create_before[1]) == (4, 0)
    assert (after["read"][0] - read_before[0], after["read"][1] - read_before[1]) == (4, 0)
    assert session_state()["plan_cache_mode"] == "force_generic_plan"


def test_pooled_janitor_takes_no_session_lock_and_skips_a_table_it_cannot_lock(tenant_a):
    leave_dead_queue_rows(tenant_a, 200)
    with autocommit_connection() as holder, autocommit_connection() as conn, override_settings(
        OMNIPOST_DATABASE_POOLER="pgbouncer"
    ):
        conn.execute("SET lock_timeout = '20s'")  # a VACUUM that queued behind the holder would fail the test
        with holder.transaction():
            holder.execute("LOCK TABLE queue_state IN SHARE UPDATE EXCLUSIVE MODE")  # as a running VACUUM holds
            vacuum_if_needed(conn, Janitor(min_dead=1, tables=("queue_state",)))
        assert dead_rows(conn, "queue_state") >= 200  # skipped, not waited for
        vacuum_if_needed(conn, Janitor(min_dead=1, tables=("queue_state",)))
        conn.execute("SELECT pg_stat_clear_snapshot()")
        assert dead_rows(conn, "queue_state") == 0
        (advisory,) = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchone()
    assert advisory == 0


def test_listen_goes_to_the_direct_url_or_nowhere_behind_a_pooler():
    with override_settings(OMNIPOST_DATABASE_POOLER="pgbouncer", OMNIPOST_LISTEN_DATABASE_URL=""):
        assert pooling.listen_params("default", "x") is None
        assert not Doorbell(lambda payload: None).available
        assert auth_cache.listener() is None and auth_cache.ttl() == auth_cache.FALLBACK_TTL
    direct = "postgres://postgres@127.0.0.1:5432/elsewhere"
    with override_settings(OMNIPOST_DATABASE_POOLER="pgbouncer", OMNIPOST_LISTEN_DATABASE_URL=direct):
        params = pooling.listen_params("default", "omnipost-test-listen")
        assert params == {"conninfo": direct, "application_name": "omnipost-test-listen", "autocommit": True}
    with override_settings(OMNIPOST_DATABASE_POOLER="none", OMNIPOST_LISTEN_DATABASE_URL=""):
        params = pooling.listen_params("default", "omnipost-test-listen")
        assert params["dbname"] == connection.settings_dict["NAME"] and "prepare_threshold" not in params


def test_a_doorbell_behind_a_pooler_listens_on_the_direct_url(tenant_a):
    db = connection.settings_dict
    direct = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    rings = []
    with override_settings(OMNIPOST_DATABASE_POOLER="pgbouncer", OMNIPOST_LISTEN_DATABASE_URL=direct):
        bell = Doorbell(rings.append, channel="omnipost_test_pooling", application_name="omnipost-test-direct")
    bell.start()
    try:
        assert bell.connected.wait(10)
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute("SELECT pg_notify('omnipost_test_pooling', 'hello')")
            (listening,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'omnipost-test-direct'"
            ).fetchone()
        assert listening == 1
        for _ in range(100):
            if rings:
                break
            bell._stop.wait(0.05)
        assert rings == ["hello"]
    finally:
        bell.stop()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OMNIPOST_DATABASE_POOLER": "pgpool"}, "OMNIPOST_DATABASE_POOLER must be one of none, pgbouncer"),
        ({"OMNIPOST_DATABASE_POOLER": "pgbouncer", "DATABASE_URL": "sqlite:///:memory:"},
         "DATABASE_URL: PostgreSQL is the only database, and sqlite:///:memory: is not a postgres:// URL"),
        ({"OMNIPOST_LISTEN_DATABASE_URL": "mysql://db/x"}, "OMNIPOST_LISTEN_DATABASE_URL must be a postgres:// URL"),
    ],
)  # fmt: skip
def test_bad_pooler_settings_stop_start_up_with_one_line(env, message):
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings", "DEBUG": "true", **env},
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"OmniPost configuration error: {message}")


def test_pooled_settings_turn_off_prepares_and_server_side_cursors():
    """…and send no startup `options` (PgBouncer refuses them: the direct connections' `-c jit=off`)."""
    code = (
        "import django; django.setup(); from django.conf import settings; d = settings.DATABASES['default']; "
        "print(d['OPTIONS']['prepare_threshold'], d['DISABLE_SERVER_SIDE_CURSORS'], settings.OMNIPOST_DATABASE_POOLER, "
        "d['OPTIONS'].get('options', '-'))"
    )
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings_test",
             "OMNIPOST_DATABASE_POOLER": "PgBouncer"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "True", "pgbouncer", "-"]


def test_direct_connections_and_the_listen_one_run_without_jit():
    """A statement whose estimate passes jit_above_cost is compiled at every execution (a claim planned
    on off statistics: 50–140 ms of LLVM a claim): every direct connection starts with jit off."""
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == ("off",)
    params = pooling.listen_params("default", "omnipost-test-jit")
    with psycopg.connect(**params) as conn:  # the doorbell's, on which a ring may be claimed
        jit = conn.execute("SELECT setting, source FROM pg_settings WHERE name = 'jit'").fetchone()
        assert jit == ("off", "client")


@pytest.mark.parametrize(("switch", "sent"), [({}, True), ({"OMNIPOST_DATABASE_JIT_OFF": "false"}, False)])
def test_the_jit_switch_decides_what_a_direct_connection_sends(switch, sent):
    """`OMNIPOST_DATABASE_JIT_OFF=false` (a proxy in between that refuses startup options): the
    connection sends none, and the server's own jit setting holds."""
    code = (
        "import django; django.setup(); from django.db import connection; c = connection.cursor(); "
        "c.execute(\"SELECT source FROM pg_settings WHERE name = 'jit'\"); print(c.fetchone()[0])"
    )
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings_test", **switch},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (result.stdout.split() == ["client"]) is sent, result.stdout  # else the server's own setting
