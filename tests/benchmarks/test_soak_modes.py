"""The soak's modes and its draw (benchmarks/soak.py): `pgbouncer_restart` only when pooled,
`failover` only with a standby, never drawn without them and refused when named without them; a
failover drawn while the new standby is still being built waits in the bag; the report lists both
kinds with their recovery, and a failover's in-flight set bounds its duplicates as a kill's does."""

from __future__ import annotations

import random
import subprocess
import sys
from types import SimpleNamespace

import pytest

from benchmarks.soak import FAULT_KINDS, Fault, Faults, SoakConfig, kinds_for, markdown, unavailable
from tests.benchmarks.test_soak_ledger import CLEAN, T0, report
from tests.queueing.dispatch_support import ROOT

BASE = tuple(k for k in FAULT_KINDS if k not in ("pgbouncer_restart", "failover"))


@pytest.mark.parametrize(
    ("pooled", "standby", "extra"),
    [(False, False, ()), (True, False, ("pgbouncer_restart",)), (False, True, ("failover",)),
     (True, True, ("pgbouncer_restart", "failover"))],
)  # fmt: skip
def test_each_mode_adds_its_own_fault_kind_and_only_that(pooled, standby, extra):
    assert kinds_for(pooled=pooled, standby=standby) == (*BASE, *extra)
    assert SoakConfig(pooled=pooled, standby=standby).kinds == (*BASE, *extra)


def test_naming_a_kind_without_its_mode_is_refused_in_one_line():
    assert unavailable(("kill9", "failover"), pooled=True) == "fault kind failover needs --standby"
    assert unavailable(("pgbouncer_restart",), standby=True) == "fault kind pgbouncer_restart needs --pooled"
    assert unavailable(("pgbouncer_restart", "failover"), pooled=True, standby=True) is None
    with pytest.raises(ValueError, match="fault kind pgbouncer_restart needs --pooled"):
        SoakConfig(kinds=("kill9", "pgbouncer_restart"))

    done = subprocess.run([sys.executable, "bench/soak.py", "--kinds", "kill9,failover", "--pooled"], cwd=ROOT,  # noqa: S603
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["bench/soak.py: fault kind failover needs --standby"]
    assert done.stdout == ""


def faults(config: SoakConfig, standby: object | None = "streaming") -> Faults:
    return Faults(SimpleNamespace(config=config, standby=standby), random.Random(5))  # noqa: S311


def test_a_run_without_the_modes_never_draws_their_kinds_and_every_round_has_each_of_its_own():
    plain = faults(SoakConfig(), standby=None)
    drawn = [plain.draw() for _ in range(len(BASE) * 20)]
    assert set(drawn) == set(BASE)
    for start in range(0, len(drawn), len(BASE)):  # a bag per round: each kind once
        assert sorted(drawn[start : start + len(BASE)]) == sorted(BASE)


def test_a_failover_waits_in_the_bag_until_the_new_standby_streams():
    both = faults(SoakConfig(pooled=True, standby=True, kinds=("failover", "kill9", "pgbouncer_restart")))
    both.soak.standby = None  # a failover just happened: the new standby is being built
    first = [both.draw(), both.draw()]
    assert sorted(first) == ["kill9", "pgbouncer_restart"]
    assert both.bag == ["failover"] and both.draw() is None  # nothing else to draw this turn
    both.soak.standby = "streaming again"
    assert both.draw() == "failover" and both.bag == []


def test_the_report_lists_both_kinds_with_their_recovery_and_bounds_a_failovers_duplicates():
    accepted = [*CLEAN, ("provider", "a", "a", T0 + 7)]  # `a` taken twice: leased when the primary died
    failover = Fault("failover", T0 + 5, T0 + 6, "port 1 → 2", "no primary 1.0 s; 1 leased", ["a"])
    bounced = Fault("pgbouncer_restart", T0 + 0.5, T0 + 0.8, "port 3", "unreachable 0.3 s")
    built = report(accepted=accepted, faults=[failover, bounced])
    assert built.failures == []
    assert built.ledger["faults_by_kind"] == {"failover": 1, "pgbouncer_restart": 1}
    assert built.ledger["kills"] == [{"kind": "failover", "target": "port 1 → 2", "at": 5.0, "in_flight": 1,
                                      "duplicates": 1}]  # fmt: skip
    rows = {row["kind"]: row for row in built.faults}
    assert rows["pgbouncer_restart"]["recovered_after"] is not None  # `a`, due after it, arrived at once
    text = markdown(built)
    assert "| failover | port 1 → 2 |" in text and "| pgbouncer_restart | port 3 |" in text

    outside = report(accepted=[*accepted, ("provider", "b", "b", T0 + 8)], faults=[failover, bounced])
    assert any("outside any kill's in-flight set" in f for f in outside.failures), outside.failures
