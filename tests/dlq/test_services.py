"""dlq.services: redrive and discard re-check state, audit every change, and keep statements fixed per batch.

Also home of the small builders the other DLQ test modules import (`dead_letters`, `bulk_dead_letters_sql`).
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from core.models import AuditEvent, Tenant
from dlq import services
from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt, Notification
from providers.models import Provider
from queueing.models import QueueItem
from tests import factories

# --- builders ---------------------------------------------------------------------------------------


def dead_letters(
    tenant: Tenant,
    prov: Provider,
    count: int = 1,
    *,
    status: str = "dead_lettered",
    failure_class: str = "transient",
    attempts: int = 3,
    error_code: str = "http_503",
    with_attempts: bool = False,
    recipient: str = "https://example.test/hook",
) -> list[DeadLetter]:
    """`count` notifications that failed, each with an open DLQ entry (and attempt rows if asked)."""
    notes = factories.notifications(tenant, prov, count, status=status, recipient=recipient)
    Notification.objects.filter(pk__in=[n.pk for n in notes]).update(attempt_count=attempts, last_error_code=error_code)
    if with_attempts:
        now = datetime.now(UTC)
        DeliveryAttempt.objects.bulk_create(
            [
                DeliveryAttempt(
                    tenant=tenant, notification=n, number=i, provider=prov, outcome="transient_error",
                    started_at=now - timedelta(seconds=10 * (attempts - i) + 1),
                    finished_at=now - timedelta(seconds=10 * (attempts - i)),
                    error_class="HTTPStatusError", error_code=error_code, http_status=503, duration_ms=12,
                )  # fmt: skip
                for n in notes
                for i in range(1, attempts + 1)
            ]
        )
    return DeadLetter.objects.bulk_create(
        [
            DeadLetter(
                tenant=tenant, notification=n, provider=prov, failure_class=failure_class,
                failure_reason=f"{error_code}: Service Unavailable", error_code=error_code, last_status_code=503,
                attempt_count=attempts,
            )  # fmt: skip
            for n in notes
        ]
    )


def bulk_dead_letters_sql(tenant: Tenant, prov: Provider, count: int, *, failure_class: str = "transient") -> None:
    """PostgreSQL: `count` dead-lettered notifications with open entries, in two INSERT … SELECT statements."""
    sample = Notification(tenant=tenant, provider=prov, channel=prov.channel, recipient="https://example.test/h")
    token = Notification._meta.get_field("recipient").get_prep_value(sample.recipient)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH notes AS (
                INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
                    subject, body, priority, queue, status, metadata, attempt_count, attempt_offset, last_error_code,
                    created_at, updated_at)
                SELECT gen_random_uuid(), %(t)s, %(ch)s, %(tok)s, 'h***', %(p)s, '{}', 's', 'b', 5, 'default',
                       'dead_lettered', '{}', 3, 0, 'http_503', now(), now()
                FROM generate_series(1, %(n)s)
                RETURNING id
            )
            INSERT INTO dead_letter_queue (id, notification_id, tenant_id, provider_id, failure_class, failure_reason,
                error_code, last_status_code, attempt_count, status, created_at, resolved_by)
            SELECT gen_random_uuid(), id, %(t)s, %(p)s, %(fc)s, 'http_503: Service Unavailable', 'http_503', 503, 3,
                   'open', now(), ''
            FROM notes
            """,
            {"t": tenant.pk, "ch": prov.channel, "tok": token, "p": prov.pk, "n": count, "fc": failure_class},
        )


def audit_count(action: str, entry: DeadLetter | None = None) -> int:
    events = AuditEvent.objects.filter(action=action)
    if entry is not None:
        events = events.filter(target_id=str(entry.pk))
    return events.count()


@pytest.fixture
def hook_a(tenant_a: Tenant) -> Provider:
    return factories.provider(tenant_a, "hook-a")


@pytest.fixture
def hook_b(tenant_b: Tenant) -> Provider:
    return factories.provider(tenant_b, "hook-b")


# --- redrive ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_redrive_requeues_with_a_fresh_budget_and_audits(tenant_a, hook_a):
    (entry,) = dead_letters(tenant_a, hook_a, attempts=8)
    result = services.redrive([entry.pk], actor="user:ops")
    assert result.redriven == [entry.pk] and result.refused == {}
    entry.refresh_from_db()
    assert entry.status == "redriven" and entry.resolved_by == "user:ops" and entry.resolved_at is not None
    note = Notification.objects.get(pk=entry.notification_id)
    assert (note.status, note.attempt_count, note.attempt_offset, note.last_error_code) == ("queued", 8, 8, "")
    item = QueueItem.objects.get()
    assert item.notification_id == note.pk and item.available_at <= datetime.now(UTC) and not item.rate_limited
    assert item.payload_json == {"channel": "webhook", "dead_letter_id": str(entry.pk)}  # ids and routing only
    event = AuditEvent.objects.get(action="dead_letter.redriven")
    assert (event.actor, event.target_type, event.target_id, event.tenant_id) == (
        "user:ops", "dlq.deadletter", str(entry.pk), tenant_a.pk)
    assert event.details["notification_id"] == str(note.pk)


@pytest.mark.django_db
def test_redrive_of_a_delivered_notification_is_refused_and_changes_nothing(tenant_a, hook_a):
    (entry,) = dead_letters(tenant_a, hook_a)
    Notification.objects.filter(pk=entry.notification_id).update(status="delivered")
    result = services.redrive([entry.pk], actor="user:ops")
    assert result.redriven == [] and result.refused == {entry.pk: services.ALREADY_DELIVERED}
    entry.refresh_from_db()
    assert entry.status == "open" and entry.resolved_at is None
    assert Notification.objects.get(pk=entry.notification_id).status == "delivered"
    assert not QueueItem.objects.exists()
    assert audit_count("dead_letter.redriven") == 0


@pytest.mark.django_db
def test_refusals_name_their_reason(tenant_a, tenant_b, hook_a, hook_b):
    done, queued, other = dead_letters(tenant_a, hook_a, 3)
    theirs = dead_letters(tenant_b, hook_b)[0]
    services.discard([done.pk], actor="user:ops")
    Notification.objects.filter(pk=queued.notification_id).update(status="retrying")
    missing = uuid.uuid4()
    result = services.redrive([done.pk, queued.pk, theirs.pk, missing, "not-a-uuid", other.pk],
                              actor="user:ops", tenant=tenant_a)  # fmt: skip
    assert result.redriven == [other.pk]
    assert result.refused == {
        done.pk: services.NOT_OPEN, queued.pk: services.NOT_REDRIVABLE, theirs.pk: services.NOT_FOUND,
        missing: services.NOT_FOUND, "not-a-uuid": services.NOT_FOUND,
    }  # fmt: skip
    assert DeadLetter.objects.get(pk=theirs.pk).status == "open"  # another tenant's entry is untouched
    assert set(services.REASONS) >= set(result.refused.values())


@pytest.mark.django_db
def test_redrive_accepts_a_queryset_and_marks_rate_limited_items(tenant_a):
    limited = factories.provider(tenant_a, "slow", rate_per_second=5.0)
    dead_letters(tenant_a, limited, 3)
    result = services.redrive(DeadLetter.objects.for_tenant(tenant_a), actor="user:ops")
    assert len(result.redriven) == 3
    assert list(QueueItem.objects.values_list("rate_limited", flat=True)) == [True] * 3


@pytest.mark.django_db
def test_redrive_with_a_rate_spreads_available_at(tenant_a, hook_a):
    entries = dead_letters(tenant_a, hook_a, 5)
    services.redrive([e.pk for e in entries], actor="user:ops", rate=2.0, batch_size=2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM available_at - now()) FROM queue_state ORDER BY available_at")
        delays = [row[0] for row in cursor.fetchall()]
    # The n-th redriven notification (0-based) becomes ready n / rate seconds later, across batches.
    assert [round(float(d) * 2) / 2 for d in delays] == [0.0, 0.5, 1.0, 1.5, 2.0]


def _statements(fn, *args, **kwargs) -> list[str]:  # noqa: ANN001
    with CaptureQueriesContext(connection) as ctx:
        fn(*args, **kwargs)
    return [q["sql"].split()[0].upper() for q in ctx.captured_queries]


@pytest.mark.django_db
def test_a_batch_is_a_fixed_number_of_statements_whatever_its_size(tenant_a, hook_a):
    one = dead_letters(tenant_a, hook_a, 1)
    many = dead_letters(tenant_a, hook_a, 300)
    small = _statements(services.redrive, [e.pk for e in one], actor="user:ops")
    big = _statements(services.redrive, [e.pk for e in many], actor="user:ops")
    # SAVEPOINT, WITH … UPDATE dlq, UPDATE notifications, the queue's enqueue (INSERT and its doorbell),
    # INSERT audit, RELEASE: the same statements for 1 entry and for 300.
    assert small == big
    assert small[:3] == ["SAVEPOINT", "WITH", "UPDATE"] and small[-2:] == ["INSERT", "RELEASE"] and len(small) <= 7
    assert QueueItem.objects.count() == 301
    refused = _statements(services.redrive, [e.pk for e in many[:50]], actor="user:ops")
    assert refused == ["SAVEPOINT", "WITH", "SELECT", "RELEASE"]  # nothing taken: one SELECT says why
    assert len(_statements(services.redrive, [e.pk for e in many] * 2, actor="user:ops", batch_size=100)) == 4 * 3


# --- discard ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_discard_closes_open_entries_once_and_audits(tenant_a, tenant_b, hook_a, hook_b):
    entry, other = dead_letters(tenant_a, hook_a, 2)
    theirs = dead_letters(tenant_b, hook_b)[0]
    result = services.discard([entry.pk, theirs.pk], actor="api_key:abc", tenant=tenant_a)
    assert result.discarded == [entry.pk] and result.refused == {theirs.pk: services.NOT_FOUND}
    entry.refresh_from_db()
    assert entry.status == "discarded" and entry.resolved_by == "api_key:abc"
    assert Notification.objects.get(pk=entry.notification_id).status == "dead_lettered"  # nothing is sent
    assert not QueueItem.objects.exists()
    assert services.discard([entry.pk], actor="api_key:abc").refused == {entry.pk: services.NOT_OPEN}
    assert services.redrive([entry.pk], actor="api_key:abc").refused == {entry.pk: services.NOT_OPEN}
    assert audit_count("dead_letter.discarded", entry) == 1
    assert audit_count("dead_letter.discarded") == 1 and audit_count("dead_letter.redriven") == 0
    assert DeadLetter.objects.get(pk=other.pk).status == "open"


# --- bulk -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_matching_filters_and_dry_run(tenant_a, tenant_b, hook_a, hook_b):
    other_provider = factories.provider(tenant_a, "other")
    transient = dead_letters(tenant_a, hook_a, 3)
    dead_letters(tenant_a, hook_a, 2, status="failed", failure_class="permanent", error_code="http_400")
    dead_letters(tenant_a, other_provider, 1)
    dead_letters(tenant_b, hook_b, 4)
    old = transient[0]
    DeadLetter.objects.filter(pk=old.pk).update(created_at=datetime.now(UTC) - timedelta(days=2))
    delivered = dead_letters(tenant_a, hook_a, 1)[0]
    Notification.objects.filter(pk=delivered.notification_id).update(status="delivered")

    def count(**kw) -> int:  # noqa: ANN003
        return services.redrive_matching(services.RedriveFilters(**kw), actor="t", dry_run=True).matched

    assert count() == 3 + 2 + 1 + 4  # delivered notifications never match
    assert count(tenant=tenant_a) == 6
    assert count(tenant=tenant_a, failure_class="permanent") == 2
    assert count(tenant=tenant_a, provider="other") == 1
    assert count(tenant=tenant_a, created_after=datetime.now(UTC) - timedelta(days=1)) == 5
    result = services.redrive_matching(services.RedriveFilters(tenant=tenant_a), actor="t", limit=4, dry_run=True)
    assert (result.matched, result.redriven, result.dry_run) == (4, 0, True)
    assert not QueueItem.objects.exists() and audit_count("dead_letter.redriven") == 0
    # Oldest first, at most `limit`.
    result = services.redrive_matching(services.RedriveFilters(tenant=tenant_a), actor="t", limit=2)
    assert result.redriven == 2 and DeadLetter.objects.get(pk=old.pk).status == "redriven"
    assert DeadLetter.objects.filter(status="redriven").count() == 2
    assert DeadLetter.objects.get(pk=delivered.pk).status == "open"


class FakeClock:
    """time.monotonic stand-in; `sleep` advances it and records every wait."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> bool:
        self.sleeps.append(seconds)
        self.now += seconds
        return False


@pytest.mark.django_db
def test_bulk_paces_batches_at_the_rate_with_an_injected_clock(tenant_a, hook_a):
    dead_letters(tenant_a, hook_a, 95)
    clock = FakeClock()
    seen: list[tuple[float, int, int]] = []
    result = services.redrive_matching(
        services.RedriveFilters(tenant=tenant_a), actor="t", rate=100.0, clock=clock, sleep=clock.sleep,
        progress=lambda done, total: seen.append((clock.now - 1000.0, done, total)),
    )  # fmt: skip
    # 100/s → batches of 10 (a tenth of a second's worth), one every 0.1 s: 10 batches, 0.9 s of waiting.
    assert (result.redriven, result.batches, result.matched) == (95, 10, 95)
    assert clock.sleeps == pytest.approx([0.1] * 9)
    for elapsed, done, _ in seen[1:]:
        assert done <= 100.0 * elapsed + 10 + 1e-6  # never ahead of the rate by more than one batch
    assert seen[0] == (0.0, 0, 95) and seen[-1][1:] == (95, 95)


@pytest.mark.django_db
def test_bulk_stops_when_the_wait_is_interrupted(tenant_a, hook_a):
    dead_letters(tenant_a, hook_a, 30)
    stop = threading.Event()
    calls = []

    def sleep(seconds: float) -> bool:
        calls.append(seconds)
        stop.set()  # as the command's signal handler would
        return True

    result = services.redrive_matching(
        services.RedriveFilters(), actor="t", rate=100.0, sleep=sleep, stop=stop, clock=FakeClock()
    )
    assert result.interrupted and result.redriven == 10 and result.batches == 1 and len(calls) == 1
    assert DeadLetter.objects.filter(status="open").count() == 20


@pytest.mark.django_db
def test_bulk_takes_a_snapshot_so_entries_failing_again_are_not_chased(tenant_a, hook_a):
    dead_letters(tenant_a, hook_a, 6)
    created: list[DeadLetter] = []

    def progress(done: int, total: int) -> None:
        if done and not created:  # a redriven notification fails again during the run
            created.extend(dead_letters(tenant_a, hook_a, 1))

    result = services.redrive_matching(services.RedriveFilters(), actor="t", batch_size=2, progress=progress)
    assert (result.matched, result.redriven, result.batches) == (6, 6, 3)
    assert DeadLetter.objects.get(pk=created[0].pk).status == "open"


# --- concurrency ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_operators_redriving_the_same_entry_at_once_requeue_it_once(tenant_a, hook_a, monkeypatch):
    """Operator 1 has taken the entry and is inside its transaction; operator 2's UPDATE waits on the
    row lock, then re-checks `status = 'open'`, finds it redriven, and re-queues nothing."""
    (entry,) = dead_letters(tenant_a, hook_a)
    inside = threading.Event()
    real_enqueue = services.enqueue

    def slow_enqueue(items, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if threading.current_thread().name == "op-1":
            inside.set()
            time.sleep(0.4)  # hold the row lock while operator 2 arrives
        return real_enqueue(items, **kwargs)

    monkeypatch.setattr(services, "enqueue", slow_enqueue)
    results: dict[str, services.RedriveResult] = {}
    elapsed: dict[str, float] = {}

    def operate(name: str) -> None:
        if name == "op-2":
            inside.wait(5)
        started = time.monotonic()
        try:
            results[name] = services.redrive([entry.pk], actor=f"user:{name}")
        finally:
            elapsed[name] = time.monotonic() - started
            connections.close_all()

    threads = [threading.Thread(target=operate, args=(n,), name=n) for n in ("op-1", "op-2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert results["op-1"].redriven == [entry.pk]
    assert results["op-2"].redriven == [] and results["op-2"].refused == {entry.pk: services.NOT_OPEN}
    assert elapsed["op-2"] >= 0.2  # it really waited for operator 1's row lock
    assert QueueItem.objects.filter(notification_id=entry.notification_id).count() == 1
    assert audit_count("dead_letter.redriven", entry) == 1
    assert DeadLetter.objects.get(pk=entry.pk).resolved_by == "user:op-1"


@pytest.mark.django_db(transaction=True)
def test_racing_redrives_and_discards_each_entry_changes_once(tenant_a, hook_a):
    """Four threads released together over the same 40 entries: every entry ends up changed by exactly one."""
    entries = dead_letters(tenant_a, hook_a, 40)
    ids = [e.pk for e in entries]
    barrier = threading.Barrier(4)
    outcomes: list[tuple[str, list]] = []

    def run(kind: str, order: list) -> None:  # noqa: ANN001
        try:
            barrier.wait(5)
            if kind == "redrive":
                outcomes.append((kind, services.redrive(order, actor=f"user:{kind}", batch_size=7).redriven))
            else:
                outcomes.append((kind, services.discard(order, actor=f"user:{kind}", batch_size=7).discarded))
        finally:
            connections.close_all()

    plan = [("redrive", ids), ("redrive", ids[::-1]), ("discard", ids[10:]), ("redrive", ids[5:] + ids[:5])]
    threads = [threading.Thread(target=run, args=p) for p in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    changed = [pk for _, done in outcomes for pk in done]
    assert sorted(changed) == sorted(ids)  # each exactly once
    redriven = {pk for kind, done in outcomes if kind == "redrive" for pk in done}
    assert set(QueueItem.objects.values_list("notification_id", flat=True)) == {
        e.notification_id for e in entries if e.pk in redriven
    }
    assert audit_count("dead_letter.redriven") + audit_count("dead_letter.discarded") == 40
