"""Single creates of concurrent request threads share a statement (services.create_notifications_shared).

The first create's batch is held until the others are seen waiting (core.grouping), so the
batching is known, not hoped for; each thread runs on its own database connection, as a web
process's request threads do."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import transaction

from core.grouping import GroupRunner
from notifications import services
from notifications.models import Notification
from notifications.services import NotificationSpec
from queueing.models import QueueItem
from tests.support.grouping import run_in_turn
from tests.support.setups import EMAIL

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


class Held:
    """The batch function, counting its calls; the first waits for `release`."""

    def __init__(self, run: Callable) -> None:
        self.run, self.calls = run, []
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, context, specs):  # noqa: ANN001, ANN204
        self.calls.append([s.subject for s in specs])
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(20)
        return self.run(context, specs)


def held_group(
    monkeypatch: pytest.MonkeyPatch, run: Callable = services._create_shared_batch
) -> tuple[Held, GroupRunner]:
    held = Held(run)
    group = GroupRunner(held, key=lambda context: (context[0].pk, context[1]), max_items=services.SHARED_MAX_ROWS)
    monkeypatch.setattr(services, "_SHARED", group)
    return held, group


def spec(setup, subject: str) -> NotificationSpec:  # noqa: ANN001
    return NotificationSpec(channel="email", recipient=EMAIL, provider=setup.mail, subject=subject, body="b")


def run_concurrently(group: GroupRunner, held: Held, calls: list[Callable[[], object]]) -> list[object]:
    """The first call starts and is held; each other one starts once the one before it is waiting."""
    return run_in_turn(group, held.entered, held.release, calls)


def test_creates_waiting_for_a_statement_share_the_next_and_each_gets_its_own_notification(setup_a, monkeypatch):
    held, group = held_group(monkeypatch)
    subjects = [f"s{i}" for i in range(6)]
    got = run_concurrently(group, held, [
        lambda s=s: services.create_notifications_shared(setup_a.tenant, [spec(setup_a, s)], actor="api_key:t")
        for s in subjects
    ])  # fmt: skip
    assert held.calls == [["s0"], subjects[1:]], "the first alone, the five that waited in one statement"
    assert [[n.subject for n in rows] for rows in got] == [[s] for s in subjects], "each its own row"
    stored = dict(Notification.objects.filter(tenant=setup_a.tenant).values_list("id", "subject"))
    assert {rows[0].pk: rows[0].subject for rows in got} == stored
    assert QueueItem.objects.filter(notification_id__in=list(stored)).count() == 6, "every one queued"


def test_another_tenants_creates_are_never_in_the_same_statement(setup_a, setup_b, monkeypatch):
    held, group = held_group(monkeypatch)
    got = run_concurrently(group, held, [
        lambda: services.create_notifications_shared(setup_a.tenant, [spec(setup_a, "a0")], actor="api_key:a"),
        lambda: services.create_notifications_shared(setup_a.tenant, [spec(setup_a, "a1")], actor="api_key:a"),
        lambda: services.create_notifications_shared(setup_b.tenant, [spec(setup_b, "b0")], actor="api_key:b"),
        lambda: services.create_notifications_shared(setup_a.tenant, [spec(setup_a, "a2")], actor="api_key:a"),
    ])  # fmt: skip
    assert held.calls == [["a0"], ["a1", "a2"], ["b0"]]
    assert [rows[0].tenant_id for rows in got] == [setup_a.tenant.pk] * 2 + [setup_b.tenant.pk, setup_a.tenant.pk]
    assert Notification.objects.filter(tenant=setup_b.tenant).get().subject == "b0"


def test_a_failed_batch_fails_every_request_in_it_and_stores_none_of_them(setup_a, monkeypatch):
    def stale_second(context, specs):  # noqa: ANN001, ANN202 - the second batch meets a config change
        if specs[0].subject != "first":
            raise services.StaleConfig()
        return services._create_shared_batch(context, specs)

    held, group = held_group(monkeypatch, stale_second)
    got = run_concurrently(group, held, [
        lambda s=s: services.create_notifications_shared(setup_a.tenant, [spec(setup_a, s)], actor="api_key:t")
        for s in ("first", "x", "y")
    ])  # fmt: skip
    assert [n.subject for n in got[0]] == ["first"]
    assert all(isinstance(g, services.StaleConfig) for g in got[1:]), got
    assert list(Notification.objects.filter(tenant=setup_a.tenant).values_list("subject", flat=True)) == ["first"]


def test_a_create_in_the_callers_transaction_runs_alone_in_it(setup_a, monkeypatch):
    held, _ = held_group(monkeypatch)
    with transaction.atomic():
        [n] = services.create_notifications_shared(setup_a.tenant, [spec(setup_a, "inside")], actor="t")
        transaction.set_rollback(True)
    assert held.calls == [] and not Notification.objects.filter(pk=n.pk).exists(), "the caller's transaction"
