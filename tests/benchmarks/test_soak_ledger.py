"""The soak's ledger fails a run for what it must not find: a lost notification, a duplicate outside
every kill's in-flight set, a delivered notification without its event, a suppressed one sent, a
receipt not shown, a process not alive. Built here from made-up sides, without a run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.soak import Fault, Incarnation, Sent, SoakConfig, build_report

T0 = 1_000_000.0


def report(*, accepted, sent=None, kills=(), api=None, alive=None, receipts=None, triggers=None, runs=(), faults=None):  # noqa: ANN001, ANN202, E501
    sent = sent or {
        "a": Sent("single", T0 + 1, T0 + 1, "queued", "hook"),
        "b": Sent("batch", T0 + 2, T0 + 2, "queued", "hook"),
        "s": Sent("subscriber", T0 + 3, T0 + 3, "suppressed", "push"),
    }
    api = api or {"a": {"status": "delivered", "receipt": "delivered"}, "b": {"status": "delivered", "receipt": None},
                  "s": {"status": "suppressed", "receipt": None}}  # fmt: skip
    load = SimpleNamespace(sent=sent, unacknowledged=0, offered=len(sent), shed=0, answers={}, retried=0, odd=[],
                           triggers=triggers or {})  # fmt: skip
    procs = {"dispatcher0": SimpleNamespace(incarnations=[Incarnation(10, T0, samples=[(T0 + 1, 2**20, 9)])])}
    soak = SimpleNamespace(load=load, procs=procs, workflow_view=list(runs),
                           receipts=SimpleNamespace(posted=receipts if receipts is not None else {"a": 1},
                                                    failed=[]))  # fmt: skip
    done = faults if faults is not None else [Fault("kill9", T0 + 5, T0 + 6, "dispatcher0", "", list(ids))
                                              for ids in kills]  # fmt: skip
    faults = SimpleNamespace(done=done, errors=[])
    return build_report(SoakConfig(kinds=("kill9",), quick=True), soak, faults, {}, accepted, api,
                        alive or {"dispatcher0": True}, True, {"load_started": T0, "load_ended": T0 + 10})  # fmt: skip


CLEAN = [("provider", "a", "a", T0 + 1.1), ("provider", "b", "b", T0 + 2.1), ("events", "evt_1", "a", T0 + 1.2),
         ("events", "evt_2", "b", T0 + 2.2)]  # fmt: skip


def test_a_clean_run_passes_and_counts_every_side():
    clean = report(accepted=CLEAN)
    assert clean.failures == []
    led = clean.ledger
    assert (led["acknowledged"], led["delivered"], led["suppressed"], led["lost"], led["duplicates"]) == (3, 2, 1, 0, 0)
    assert (led["events_delivered"], led["receipts_acknowledged"]) == (2, 1)


def test_a_duplicate_within_a_kills_in_flight_set_passes_and_is_counted_against_it():
    ok = report(accepted=[*CLEAN, ("provider", "a", "a", T0 + 7)], kills=[["a", "x"]])
    assert ok.failures == []
    assert ok.ledger["kills"][0]["in_flight"] == 2 and ok.ledger["kills"][0]["duplicates"] == 1


def test_a_duplicate_after_a_send_that_timed_out_passes_only_within_its_timeouts():
    def api(timeouts: int) -> dict:  # noqa: ANN001
        return {"a": {"status": "delivered", "receipt": "delivered", "timeouts": timeouts},
                "b": {"status": "delivered", "receipt": None}, "s": {"status": "suppressed", "receipt": None}}

    once_more = [*CLEAN, ("provider", "a", "a", T0 + 7)]
    ok = report(accepted=once_more, api=api(1))
    assert ok.failures == [] and ok.ledger["duplicates_after_timeout"] == 1
    twice_more = [*once_more, ("provider", "a", "a", T0 + 8)]
    assert any("outside any kill's in-flight set" in f for f in report(accepted=twice_more, api=api(1)).failures)
    assert any("outside any kill's in-flight set" in f for f in report(accepted=once_more, api=api(0)).failures)


@pytest.mark.parametrize(
    ("accepted", "kills", "api", "alive", "receipts", "failure"),
    [
        (CLEAN[1:], [], None, None, None, "never reached the provider"),
        ([*CLEAN, ("provider", "a", "a", T0 + 7)], [["b"]], None, None, None, "outside any kill's in-flight set"),
        ([*CLEAN, ("provider", "a", "a", T0 + 7)], [], None, None, None, "outside any kill's in-flight set"),
        (CLEAN[:3], [], None, None, None, "without their event"),
        ([*CLEAN, ("provider", "s", "s", T0 + 4)], [], None, None, None, "suppressed notifications reached"),
        (CLEAN, [], None, None, {"b": 1}, "receipts not shown"),
        (CLEAN, [], None, {"dispatcher0": False}, None, "not alive at the end"),
        (CLEAN, [], {"a": {"status": "delivered", "receipt": "delivered"}, "b": {"status": "queued", "receipt": None},
                     "s": {"status": "suppressed", "receipt": None}}, None, None, "disagree"),  # fmt: skip
    ],
)
def test_what_the_soak_must_not_find_fails_the_ledger(accepted, kills, api, alive, receipts, failure):
    failed = report(accepted=accepted, kills=kills, api=api, alive=alive, receipts=receipts)
    assert any(failure in message for message in failed.failures), failed.failures
    assert not failed.ok


def test_a_process_whose_open_files_keep_growing_fails_and_one_that_is_flat_passes():
    flat = [(T0 + i * 5, 90 * 2**20, 40 + i % 3) for i in range(40)]  # 200 s, open files 40–42
    leaking = [(T0 + i * 5, 90 * 2**20, 40 + 3 * i) for i in range(40)]  # +3 files every 5 s
    for samples, failing in ((flat, False), (leaking, True)):
        procs = {"dispatcher0": SimpleNamespace(incarnations=[Incarnation(10, T0, samples=samples)])}
        load = SimpleNamespace(sent={"a": Sent("single", T0 + 1, T0 + 1, "queued", "hook")}, unacknowledged=0,
                               offered=1, shed=0, answers={}, retried=0, odd=[])  # fmt: skip
        soak = SimpleNamespace(load=load, procs=procs, receipts=SimpleNamespace(posted={}, failed=[]))
        built = build_report(SoakConfig(kinds=("kill9",)), soak, SimpleNamespace(done=[], errors=[]), {},
                             [("provider", "a", "a", T0 + 2), ("events", "e", "a", T0 + 3)],
                             {"a": {"status": "delivered", "receipt": None}}, {"dispatcher0": True}, True,
                             {"load_started": T0, "load_ended": T0 + 200})  # fmt: skip
        assert any("grew" in f for f in built.failures) is failing, built.failures


def test_every_acknowledged_workflow_trigger_needs_its_run_completed_with_each_send_steps_notification():
    sent = {"a": Sent("single", T0 + 1, T0 + 1, "queued", "hook"), "b": Sent("batch", T0 + 2, T0 + 2, "queued", "hook"),
            "s": Sent("subscriber", T0 + 3, T0 + 3, "suppressed", "push"),
            "w1": Sent("workflow", T0 + 4, T0 + 4, "queued", "inbox"),
            "w2": Sent("workflow", T0 + 4, T0 + 4, "queued", "push")}  # fmt: skip
    api = {"a": {"status": "delivered", "receipt": "delivered"}, "b": {"status": "delivered", "receipt": None},
           "s": {"status": "suppressed", "receipt": None}, "w1": {"status": "delivered", "receipt": None},
           "w2": {"status": "delivered", "receipt": None}}  # fmt: skip
    arrived = [*CLEAN, ("provider", "", "w1", T0 + 4.5), ("provider", "w2", "w2", T0 + 5.6),
               ("events", "evt_3", "w1", T0 + 4.6), ("events", "evt_4", "w2", T0 + 5.7)]  # fmt: skip
    done = {"id": "r1", "trigger_id": "t1", "status": "completed", "sends": [("hello", "w1", "delivered"),
                                                                             ("nudge", "w2", "delivered")]}  # fmt: skip
    ok = report(accepted=arrived, sent=sent, api=api, triggers={"t1": T0 + 4}, runs=[done])
    assert ok.failures == []
    led = ok.ledger
    assert (led["workflow_triggers"], led["workflow_runs_completed"], led["workflow_notifications"]) == (1, 1, 2)
    assert led["workflow_notifications_delivered"] == 2 and led["delivered_by_kind"]["workflow"] == 2

    without = report(accepted=arrived, sent=sent, api=api, triggers={"t1": T0 + 4, "t2": T0 + 5}, runs=[done])
    assert any("workflow triggers without a run" in f for f in without.failures), without.failures
    still = {**done, "status": "waiting"}
    waiting = report(accepted=arrived, sent=sent, api=api, triggers={"t1": T0 + 4}, runs=[still])
    assert any("workflow runs not completed" in f for f in waiting.failures), waiting.failures
    no_send = {**done, "sends": [("hello", "w1", "delivered"), ("nudge", None, None)]}
    skipped = report(accepted=arrived, sent=sent, api=api, triggers={"t1": T0 + 4}, runs=[no_send])
    assert any("send steps without a notification" in f for f in skipped.failures), skipped.failures
    twice = {**done, "made": {"hello": 2, "nudge": 1}}  # the step ran twice: a second notification
    made_twice = report(accepted=arrived, sent=sent, api=api, triggers={"t1": T0 + 4}, runs=[twice])
    assert any("made more than one notification" in f for f in made_twice.failures), made_twice.failures
    lost = report(accepted=arrived[:-3] + arrived[-2:], sent=sent, api=api, triggers={"t1": T0 + 4}, runs=[done])
    assert any("never reached the provider" in f for f in lost.failures), lost.failures
