"""The short chaos soak (benchmarks/soak.py, as `bench/soak.py --quick --seconds 40 --rate 50`):
the real processes on a private PostgreSQL server, every kind of fault at least once, and the same
ledger as the long soak, so a change that breaks recovery fails here (a share of the load with the
test key, a topic trigger and a bulk send among it). About 80 s of wall time. And a shorter one
(`--pooled --standby`, about 70 s): through PgBouncer, with a streaming standby, a PgBouncer restart
and a failover among the faults."""

from __future__ import annotations

import pytest

from benchmarks.soak import SoakConfig, kinds_for, markdown, run
from tests.queueing.conftest import migrated_schema, restore_schema  # noqa: F401 - the fixture, for this module

# django_db: the test database (which `migrated_schema` dumps) is made only for tests that use one
pytestmark = [pytest.mark.slow, pytest.mark.django_db]


@pytest.mark.timeout(240)
def test_a_short_soak_with_every_fault_loses_nothing_and_recovers(migrated_schema, tmp_path):  # noqa: F811
    config = SoakConfig(seconds=40, rate=50, fault_every=40 / (len(kinds_for()) + 0.5), seed=7, quick=True,
                        workdir=tmp_path, prepare=lambda dsn: restore_schema(migrated_schema, dsn),
                        topic_members=200, topic_triggers=1)  # fmt: skip
    report = run(config)
    print(markdown(report))  # the figures, in the test's output (-s) or its failure report
    ledger = report.ledger

    assert report.failures == []
    assert set(ledger["faults_by_kind"]) == set(kinds_for())
    assert ledger["lost"] == 0 and ledger["acknowledged"] >= 1500
    assert ledger["delivered"] == ledger["expected_deliveries"]
    # in-app sends arrive as feed items, through the same queue and faults as the rest
    assert ledger["delivered_by_kind"]["inbox"] > 0 and ledger["delivered_by_kind"]["subscriber"] > 0
    assert ledger["suppressed"] == ledger["opted_out_suppressed"] > 0 and ledger["suppressed_but_sent"] == 0
    # native push through the real `fcm`, `apns` and `webpush` kinds to the vendors' stand-ins, under the
    # same faults (Web Push messages decrypted by the stand-in with each subscription's private key)
    by_kind = ledger["delivered_by_kind"]
    assert by_kind["fcm"] > 0 and by_kind["apns"] > 0 and by_kind["webpush"] > 0
    assert ledger["push_arrivals"] == by_kind["fcm"] + by_kind["apns"] + by_kind["webpush"]
    assert ledger["push_refused"] == 0 and ledger["push_duplicates"] <= ledger["duplicates"]
    # workflow triggers: each acknowledged one's run completed, its send steps' notifications arrived
    assert ledger["workflow_triggers"] > 0 and ledger["workflow_runs_completed"] == ledger["workflow_runs"] > 0
    assert ledger["workflow_triggers_without_runs"] == ledger["workflow_runs_not_completed"] == 0
    assert ledger["workflow_steps_made_twice"] == 0
    assert ledger["workflow_notifications"] == 2 * ledger["workflow_runs"]
    assert ledger["workflow_notifications_delivered"] == ledger["workflow_notifications"]
    # test mode: a share of the load with the test key, each ending as its simulator address implies (a
    # bounce with its receipt), none at a provider, stand-in or feed, none listed to the live key
    assert ledger["test_notifications"] > 0 and ledger["test_not_as_expected"] == 0
    assert {"delivered", "failed", "dead_lettered"} <= set(ledger["test_by_status"])
    assert ledger["test_receipts"].get("bounced", 0) > 0
    assert ledger["test_arrived"] == ledger["test_listed_live"] == ledger["live_listed_to_test"] == 0
    # a workflow trigger to a topic: one run per member, all completed
    assert ledger["topic_triggers"] == 1 and ledger["topic_wrong"] == 0
    assert ledger["topic_runs"] == ledger["topic_runs_completed"] == ledger["topic_members"] == 200
    # a bulk send: completed, each row one notification, every one delivered
    assert ledger["bulk_status"] == "completed" and ledger["bulk_rows"] == ledger["bulk_distinct_rows"] == 300
    assert ledger["bulk_notifications"] == ledger["bulk_delivered"] == 300
    assert ledger["events_missing"] == 0 and ledger["events_delivered"] == ledger["delivered"]
    assert ledger["receipts_acknowledged"] > 0 and ledger["receipts_missing"] == 0
    assert ledger["duplicates_outside_in_flight"] == 0
    assert all(kill["duplicates"] <= kill["in_flight"] for kill in ledger["kills"])
    assert any(kill["target"].startswith("dispatcher") and kill["kind"] == "kill9" for kill in ledger["kills"])
    assert ledger["processes_alive"] == ledger["processes"] == 7
    assert ledger["restarts"] >= 2  # the scheduler's kill and kill9's victim were started again
    assert all(f["recovered_after"] is not None for f in report.faults), report.faults


@pytest.mark.timeout(240)
def test_a_short_pooled_soak_with_a_standby_survives_a_pgbouncer_restart_and_a_failover(migrated_schema, tmp_path):  # noqa: F811
    # seed 3 draws: kill9, pgbouncer_restart, failover, pg_restart, terminate_backends (the last two on
    # the promoted server)
    kinds = ("pgbouncer_restart", "failover", "pg_restart", "terminate_backends", "kill9")
    config = SoakConfig(seconds=30, rate=40, fault_every=30 / (len(kinds) + 0.5), seed=3, quick=True,
                        pooled=True, standby=True, kinds=kinds, workdir=tmp_path,
                        prepare=lambda dsn: restore_schema(migrated_schema, dsn),
                        topic_members=100, topic_triggers=1)  # fmt: skip
    report = run(config)
    print(markdown(report))
    ledger = report.ledger

    assert report.failures == []
    assert report.config["pooled"] and report.config["standby"]
    assert ledger["faults_by_kind"] == dict.fromkeys(kinds, 1)
    assert ledger["lost"] == 0 and ledger["delivered"] == ledger["expected_deliveries"] > 0
    assert ledger["events_missing"] == 0 and ledger["receipts_missing"] == 0
    assert ledger["bulk_status"] == "completed" and ledger["workflow_runs_not_completed"] == 0
    # duplicates only within a kill's or the failover's in-flight set (the leases the promoted server held)
    assert ledger["duplicates_outside_in_flight"] == 0
    assert all(kill["duplicates"] <= kill["in_flight"] for kill in ledger["kills"])
    assert "failover" in {kill["kind"] for kill in ledger["kills"]}
    assert ledger["processes_alive"] == ledger["processes"] == 7
    faults = {f["kind"]: f for f in report.faults}
    assert [f["kind"] for f in report.faults] == ["kill9", "pgbouncer_restart", "failover", "pg_restart",
                                                  "terminate_backends"]  # fmt: skip
    # the standby was promoted, a new one built on the old primary's port, and the later restart hit
    # the new primary
    old, new = faults["failover"]["target"].removeprefix("port ").split(" → ")
    assert "new standby streaming" in faults["failover"]["detail"]
    assert faults["pg_restart"]["target"] == faults["terminate_backends"]["target"] == f"port {new}" != f"port {old}"
    assert all(f["recovered_after"] is not None for f in report.faults), report.faults
