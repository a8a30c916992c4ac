"""receipts.grouping: concurrent requests of one process share the apply statement (group apply).

The batching itself is tested with a stand-in apply that holds its first call until released (so
the others are known to be waiting); the last test runs the real statement from eight threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from notifications.models import Notification
from receipts import grouping
from receipts.grouping import BatchInterrupted, GroupApply
from receipts.inbound import ProviderView, Receipt
from receipts.models import NotificationEvent
from receipts.services import ApplyResult, apply_receipts
from tests import factories
from tests.receipts.conftest import SECRET_A, receipt
from tests.support.grouping import run_in_turn

pytestmark = pytest.mark.timeout(60)

def view(pk: int, edited: int | None) -> ProviderView:
    at = datetime(2026, 1, edited, tzinfo=UTC) if edited else None
    return ProviderView(id=pk, tenant_id="t", kind="webhook", config={}, secrets={}, updated_at=at)


A, A_EDITED, B = view(1, 1), view(1, 2), view(2, None)


def receipts(n: int, tag: str) -> list[Receipt]:
    return [receipt(f"{tag}-{i}", "delivered", event_id=f"{tag}-{i}") for i in range(n)]


class HeldApply:
    """Records each call's (provider id, notification ids); the first call waits for `release`."""

    def __init__(self, outcome: Callable[[ProviderView, list[Receipt]], ApplyResult] | None = None) -> None:
        self.calls: list[tuple[int, list[str]]] = []
        self.entered, self.release = threading.Event(), threading.Event()
        self.outcome = outcome or (lambda view, rs: ApplyResult(provider_id=view.id, applied=len(rs)))

    def __call__(self, view: ProviderView, rs: list[Receipt]) -> ApplyResult:
        self.calls.append((view.id, [r.notification_id for r in rs]))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(20)
        return self.outcome(view, rs)


def run_held(group: GroupApply, held: HeldApply, first: tuple, queued: list[tuple]) -> dict[str, object]:
    """`first` applies (and is held); once it is in, each of `queued` applies from its own thread and
    is seen waiting; then the hold is released. Returns what each request got, by its first receipt's id."""
    requests = [first, *queued]
    got = run_in_turn(group, held.entered, held.release, [lambda a=args: group.apply(*a) for args in requests])
    return {rs[0].notification_id: outcome for (_, rs), outcome in zip(requests, got, strict=True)}


def test_a_request_alone_is_applied_at_once_by_itself():
    held = HeldApply()
    held.release.set()
    group = GroupApply(held)
    result = group.apply(A, receipts(2, "x"))
    assert result.applied == 2 and held.calls == [(1, ["x-0", "x-1"])]
    assert not group._busy and not group._waiting


def test_requests_arriving_during_a_statement_share_the_next_one():
    held = HeldApply()
    group = GroupApply(held)
    got = run_held(group, held, (A, receipts(1, "first")), [(A, receipts(2, f"q{i}")) for i in range(5)])
    assert len(held.calls) == 2, "five waiting requests, one statement"
    assert held.calls[1] == (1, [f"q{i}-{j}" for i in range(5) for j in range(2)])
    assert got["first-0"].applied == 1
    assert all(got[f"q{i}-0"].applied == 10 for i in range(5)), "each request gets its batch's outcome"
    assert not group._busy and not group._waiting


def test_a_batch_holds_one_provider_view_and_at_most_max_rows():
    held = HeldApply()
    group = GroupApply(held, max_rows=4)
    queued = [(A, receipts(2, "a1")), (B, receipts(1, "b1")), (A, receipts(2, "a2")), (A, receipts(1, "a3")),
              (A_EDITED, receipts(1, "e1")), (B, receipts(1, "b2"))]  # fmt: skip
    got = run_held(group, held, (A, receipts(1, "first")), queued)
    assert held.calls == [
        (1, ["first-0"]),
        (1, ["a1-0", "a1-1", "a2-0", "a2-1"]),  # a3 would make five
        (2, ["b1-0", "b2-0"]),
        (1, ["a3-0"]),
        (1, ["e1-0"]),  # the provider edited since: not applied with the older view's receipts
    ]
    assert {k: v.applied for k, v in got.items()} == {"first-0": 1, "a1-0": 4, "a2-0": 4, "b1-0": 2, "b2-0": 2,
                                                       "a3-0": 1, "e1-0": 1}  # fmt: skip


def test_an_error_reaches_every_request_of_its_batch_and_the_next_batch_still_runs():
    def outcome(view, rs):  # noqa: ANN001, ANN202
        if view.id == 2:
            raise RuntimeError("database gone")
        return ApplyResult(provider_id=view.id, applied=len(rs))

    held = HeldApply(outcome)
    group = GroupApply(held)
    got = run_held(group, held, (A, receipts(1, "first")),
                   [(B, receipts(1, "b1")), (B, receipts(1, "b2")), (A, receipts(1, "a1"))])  # fmt: skip
    assert isinstance(got["b1-0"], RuntimeError) and got["b1-0"] is got["b2-0"]
    assert got["first-0"].applied == 1 and got["a1-0"].applied == 1
    assert not group._busy


def test_a_stale_view_is_every_requests_answer():
    held = HeldApply(lambda view, rs: ApplyResult(provider_id=view.id, stale=True))
    group = GroupApply(held)
    got = run_held(group, held, (A, receipts(1, "first")), [(A, receipts(1, "q1")), (A, receipts(1, "q2"))])
    assert all(r.stale for r in got.values()) and len(held.calls) == 2


def test_an_interrupted_leader_hands_over_and_its_batch_answers_an_error():
    calls = []

    def apply(view, rs):  # noqa: ANN001, ANN202
        calls.append(rs[0].notification_id)
        raise KeyboardInterrupt

    group = GroupApply(apply)
    with pytest.raises(KeyboardInterrupt):
        group.apply(A, receipts(1, "x"))
    assert not group._busy, "the next request leads"
    with pytest.raises(KeyboardInterrupt):
        group.apply(A, receipts(1, "y"))
    assert calls == ["x-0", "y-0"]
    assert issubclass(BatchInterrupted, RuntimeError)


@pytest.mark.django_db(transaction=True)
def test_eight_threads_share_the_real_statement_and_every_receipt_lands_once(tenant_a, monkeypatch):
    prov = factories.provider(tenant_a, "hook", secrets={"signing_secret": SECRET_A})
    notes = factories.notifications(tenant_a, prov, 8, status="delivered")
    from receipts import providers as provider_views

    loaded = provider_views.load(prov.pk)

    def real(view, rs):  # noqa: ANN001, ANN202 - each batch on its leader's own connection
        return apply_receipts(view, rs)

    held = HeldApply(real)
    group = GroupApply(held)
    monkeypatch.setattr(grouping, "_GROUP", group)
    again = receipt(notes[1], "bounced", bounce_type="hard", event_id="same-event")
    queued = [(loaded, [receipt(n, "bounced", bounce_type="hard", event_id="same-event" if n is notes[1] else None)])
              for n in notes[1:]] + [(loaded, [again])]  # fmt: skip

    requests = [(loaded, [receipt(notes[0], "delivered")]), *queued]
    got = run_in_turn(group, held.entered, held.release,
                      [lambda a=args: grouping.apply_grouped(*a) for args in requests])  # fmt: skip
    assert len(got) == 9 and not any(r.stale for r in got)
    assert len(held.calls) == 2, "the first request alone, then the other eight together"
    receipts_now = dict(Notification.objects.filter(pk__in=[n.pk for n in notes]).values_list("id", "receipt"))
    assert receipts_now[notes[0].pk] == "delivered"
    assert {receipts_now[n.pk] for n in notes[1:]} == {"bounced"}
    assert NotificationEvent.objects.filter(notification_id__in=[n.pk for n in notes]).count() == 8, (
        "the same vendor event twice in one batch is stored once"
    )
