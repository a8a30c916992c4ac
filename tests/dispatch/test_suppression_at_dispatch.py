"""The check at dispatch: a claim's items are checked against the suppression list as it is now, in
one statement per claim; an item suppressed meanwhile ends `suppressed` with no attempt and no send,
also with a real dispatcher process that was stopped while the suppression was added."""

from __future__ import annotations

import pytest

from dispatch import delivery
from dispatch.delivery import Outcome, claim_and_start, record_outcomes, suppressed_among
from notifications.models import DeliveryAttempt, Notification
from queueing.models import QueueItem
from recipients import suppressions
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import SmtpSink

FROM = "noreply@omnipost.test"


def _count_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    executed: list[str] = []
    real = delivery.hot_cursor

    class Counting:
        def __init__(self, cursor) -> None:  # noqa: ANN001
            self.cursor = cursor

        def __enter__(self):  # noqa: ANN204
            self.cursor.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.cursor.__exit__(*exc)

        def execute(self, sql: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            executed.append(sql)
            return self.cursor.execute(sql, *args, **kwargs)

        def fetchall(self):  # noqa: ANN202
            return self.cursor.fetchall()

    monkeypatch.setattr(delivery, "hot_cursor", lambda *a, **k: Counting(real(*a, **k)))
    return executed


@pytest.mark.django_db
def test_a_claim_is_checked_in_one_statement_and_suppressed_items_end_unsent(tenant_a, tenant_b, monkeypatch):
    mail_a = factories.provider(tenant_a, "mail", kind="console", channel="email", config={})
    mail_b = factories.provider(tenant_b, "mail", kind="console", channel="email", config={})
    blocked = factories.queued(tenant_a, mail_a, 3, recipient="Jane@Example.com")
    scoped = factories.queued(tenant_a, mail_a, 2, recipient="news@example.com")
    free = factories.queued(tenant_a, mail_a, 20, recipient="other@example.com")
    foreign = factories.queued(tenant_b, mail_b, 5, recipient="jane@example.com")  # tenant B: not suppressed
    suppressions.suppress(tenant_a.pk, "email", "jane@example.com", "hard_bounce")
    suppressions.suppress(tenant_a.pk, "email", "news@example.com", "unsubscribed", "general")
    suppressions.suppress(tenant_a.pk, "email", "other@example.com", "unsubscribed", "news")  # another category

    prepared, skipped = claim_and_start(100, look_for_starving=False)
    assert len(prepared) == 30 and not skipped
    executed = _count_statements(monkeypatch)
    found = suppressed_among(prepared)
    assert len(executed) == 1, executed
    ids = {prepared[i].notification_id for i in found}
    assert ids == {n.pk for n in blocked + scoped}

    outcomes = [Outcome(lease=prepared[i].lease, kind="suppressed") for i in found]
    assert len(record_outcomes(outcomes).ours) == 5
    stored = dict(Notification.objects.values_list("pk", "status"))
    assert {stored[n.pk] for n in blocked + scoped} == {"suppressed"}
    assert {stored[n.pk] for n in free + foreign} == {"queued"}  # still leased, not recorded yet
    assert not DeliveryAttempt.objects.exists()
    assert not QueueItem.objects.filter(notification_id__in=[n.pk for n in blocked + scoped]).exists()


@pytest.mark.django_db
def test_an_empty_claim_costs_no_check():
    assert suppressed_among([]) == set()


@pytest.mark.django_db(transaction=True)
def test_a_suppression_added_while_the_dispatcher_is_stopped_is_honoured(tenant_a, subprocess_env, tmp_path):
    with SmtpSink(max_seconds=60) as sink:
        config = {"host": "127.0.0.1", "port": sink.port, "from_email": FROM, "timeout_seconds": 5}
        mail = factories.provider(tenant_a, "mail", kind="smtp", channel="email", config=config, secrets={})
        # a first run delivers, then the dispatcher stops
        [first] = factories.queued(tenant_a, mail, 1, recipient="jane@example.com")
        procs = start_dispatchers(1, subprocess_env, "--batch-size", "10", log_dir=tmp_path)
        try:
            assert wait_started(tmp_path, 1)
            assert wait_until(lambda: Notification.objects.get(pk=first.pk).status == "delivered", 20)
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 20) == [0]
        assert sink.wait_for(1)

        # queued while no dispatcher runs; then the address bounces
        waiting = factories.queued(tenant_a, mail, 3, recipient="jane@example.com")
        others = factories.queued(tenant_a, mail, 2, recipient="sam@example.com")
        suppressions.suppress(tenant_a.pk, "email", "JANE@example.com", "hard_bounce", source_notification_id=first.pk)

        for log in tmp_path.glob("dispatcher*.log"):
            log.unlink()
        procs = start_dispatchers(1, subprocess_env, "--batch-size", "10", log_dir=tmp_path)
        try:
            assert wait_started(tmp_path, 1)
            ids = [n.pk for n in waiting + others]
            assert wait_until(lambda: not QueueItem.objects.filter(notification_id__in=ids).exists(), 20)
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 20) == [0]
        assert sink.wait_for(3)
        rcpts = sorted(r for m in sink.messages for r in m.rcpt_tos)
    assert rcpts == ["jane@example.com", "sam@example.com", "sam@example.com"]
    statuses = dict(Notification.objects.values_list("pk", "status"))
    assert [statuses[n.pk] for n in waiting] == ["suppressed"] * 3
    assert [statuses[n.pk] for n in others] == ["delivered"] * 2
    assert not DeliveryAttempt.objects.filter(notification_id__in=[n.pk for n in waiting]).exists()
    assert Notification.objects.get(pk=waiting[0].pk).attempt_count == 0


@pytest.mark.django_db
def test_at_dispatch_a_critical_category_ignores_entries_scoped_to_it_but_not_those_for_all(tenant_a):
    from recipients.models import Category

    Category.objects.create(tenant=tenant_a, key="security", critical=True)
    Category.objects.create(tenant=tenant_a, key="news")
    mail = factories.provider(tenant_a, "mail", kind="console", channel="email", config={})
    rows = {}
    for address in ("scoped@example.com", "all@example.com"):
        for category in ("security", "news"):
            [n] = factories.queued(tenant_a, mail, 1, recipient=address)
            Notification.objects.filter(pk=n.pk).update(category=category)
            rows[(address, category)] = n.pk
        suppressions.suppress(tenant_a.pk, "email", "scoped@example.com", "unsubscribed", "security")
        suppressions.suppress(tenant_a.pk, "email", "scoped@example.com", "unsubscribed", "news")
    suppressions.suppress(tenant_a.pk, "email", "all@example.com", "complaint")
    prepared, _ = claim_and_start(10, look_for_starving=False)
    blocked = {prepared[i].notification_id for i in suppressed_among(prepared)}
    assert blocked == {rows[("scoped@example.com", "news")], rows[("all@example.com", "security")],
                       rows[("all@example.com", "news")]}  # fmt: skip
