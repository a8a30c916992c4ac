"""Events from delivery outcomes, delivered by the dispatcher's event lane to a real loopback
receiver that verifies each request with the `standardwebhooks` package."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db.models.functions import Now
from standardwebhooks import Webhook

from dispatch.delivery import Attempt, Outcome, claim_and_start, record_outcomes
from dispatch.dispatcher import Dispatcher, DispatcherConfig
from events import deliveries, emit
from events.deliveries import Result
from events.models import DeliveryStatus, Event, EventAttempt, EventDelivery, EventEndpoint
from events.services import create_endpoint, update_endpoint
from notifications.models import Notification
from tests import factories
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = pytest.mark.django_db(transaction=True)

OTHER_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()


def run_once(**overrides) -> Dispatcher:
    dispatcher = Dispatcher(DispatcherConfig(once=True, jitter=False, **overrides))
    assert dispatcher.run() == 0
    return dispatcher


def hook_for(tenant, receiver, name="hook"):
    return factories.provider(tenant, name, config={"url": receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET})  # fmt: skip


def endpoint(tenant, receiver, types, name="ops", secret=OTHER_SECRET):
    return create_endpoint(tenant, name=name, url=receiver.url, event_types=types, actor="test", secret=secret)[0]


def test_outcomes_become_signed_events_for_subscribed_types_only(tenant_a, tenant_b, webhook_receiver):
    with HttpReceiver(secret=OTHER_SECRET, max_seconds=60) as events_rx, \
         HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60, status=400) as refusing:  # fmt: skip
        endpoint(tenant_a, events_rx, ["notification.failed"])
        endpoint(tenant_b, events_rx, ["*"], name="b-ops")  # tenant b has no notifications: gets nothing
        ok = factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 3)
        (failed,) = factories.queued(tenant_a, hook_for(tenant_a, refusing, "refusing"), 1)
        run_once()
        assert webhook_receiver.wait_for(3) and refusing.wait_for(1)
        assert events_rx.wait_for(1)
        (request,) = events_rx.requests
        assert request.verified is True and request.status == 200
        # verified again here with the package, against the exact bytes received
        Webhook(OTHER_SECRET).verify(request.body, request.headers)
        event = Event.objects.get()
        assert request.webhook_id == event.public_id and event.public_id.startswith("evt_")
        assert event.tenant_id == tenant_a.pk
        payload = request.payload
        assert payload["type"] == "notification.failed" and payload["timestamp"].endswith("Z")
        assert payload["data"] == {
            "notification_id": str(failed.id), "status": "failed", "receipt": None, "bounce_type": None,
            "channel": "webhook", "recipient_masked": failed.recipient_masked, "provider": "refusing",
            "attempt_count": 1, "error_code": "http_400",
        }  # fmt: skip
        assert failed.recipient not in request.body.decode()
        assert not any(str(n.id) in request.body.decode() for n in ok)
        assert EventDelivery.objects.get().status == DeliveryStatus.DELIVERED
        attempt = EventAttempt.objects.get()
        assert (attempt.status, attempt.http_status, attempt.event_type) == ("delivered", 200, "notification.failed")


def test_no_endpoint_no_event_and_the_dispatcher_runs_without_the_lane(tenant_a, webhook_receiver):
    factories.queued(tenant_a, hook_for(tenant_a, webhook_receiver), 5)
    run_once(event_lane=False)
    assert webhook_receiver.wait_for(5)
    assert not Event.objects.exists()


def _counting_executes(monkeypatch) -> list[str]:
    """Every statement the dispatcher's hot path sends through psycopg cursors (its raw cursors
    bypass Django's query capture), from this thread only: a thread another test left behind (a
    doorbell, a lane) may run its own statements meanwhile."""
    sent: list[str] = []
    original = psycopg.Cursor.execute
    mine = threading.get_ident()

    def execute(self, query, params=None, **kwargs):  # noqa: ANN001, ANN202
        if threading.get_ident() == mine:
            sent.append(str(query))
        return original(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    return sent


@pytest.mark.parametrize("size", [3, 60])
def test_the_record_statement_stays_one_per_batch_with_events(tenant_a, monkeypatch, size):
    endpoint(tenant_a, HttpReceiver(), ["*"])  # never started: nothing is sent in this test
    prov = factories.provider(tenant_a)
    factories.queued(tenant_a, prov, size)
    prepared, _ = claim_and_start(size, lease_seconds=30)
    now = factories_now()
    outcomes = [
        Outcome(p.lease, "delivered", Attempt(1, now, now, "delivered", http_status=200)) if i % 3
        else Outcome(p.lease, "failed", Attempt(1, now, now, "permanent_error", error_code="http_404"),
                     error_code="http_404", failure_class="permanent", failure_reason="http_404")
        for i, p in enumerate(prepared)
    ]  # fmt: skip
    sent = _counting_executes(monkeypatch)
    recorded = record_outcomes(outcomes)
    assert len(sent) == 1 and len(recorded.ours) == size and recorded.batched == size
    monkeypatch.undo()
    # the outbox: one row for the batch, its facts in arrays; no event or delivery yet
    assert _outcome_batches() == [size] and not Event.objects.exists() and not EventDelivery.objects.exists()
    # the lane's first claim (one statement) opens it into events, the next fans them out, leased to it
    sent = _counting_executes(monkeypatch)
    opening = deliveries.claim_due(100, 30, uuid.uuid4())
    token = uuid.uuid4()
    claimed = deliveries.claim_due(100, 30, token)
    assert len(sent) == 2
    monkeypatch.undo()
    assert (len(opening), opening.opened, _outcome_batches()) == (0, size, [])
    assert Event.objects.filter(type="notification.failed").count() == len(range(0, size, 3))
    assert len(claimed) == size == Event.objects.count() and {c.attempt for c in claimed} == {1}
    assert EventDelivery.objects.filter(status="pending", lock_token=token).count() == size
    assert not Event.objects.filter(fanout_pending=True).exists()
    for c in claimed:  # what is POSTed: read from the notification and the batch (its timestamp)
        payload = json.loads(c.body)
        event = Event.objects.get(pk=uuid.UUID(c.event_id.removeprefix("evt_")))
        note = Notification.objects.get(pk=payload["data"]["notification_id"])
        assert payload == event.payload and payload["type"] == c.event_type == f"notification.{note.status}"
        assert payload["data"] == {
            "notification_id": str(note.pk), "status": note.status, "receipt": None, "bounce_type": None,
            "channel": note.channel, "recipient_masked": note.recipient_masked, "provider": prov.name,
            "attempt_count": note.attempt_count, "error_code": note.last_error_code or None,
        }  # fmt: skip
        assert payload["timestamp"] == event.created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _outcome_batches() -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT cardinality(notification_ids) FROM event_outcome_batches ORDER BY id")
        return [n for (n,) in cursor.fetchall()]


def test_outcomes_of_tenants_without_an_endpoint_make_no_batch(tenant_a, tenant_b):
    endpoint(tenant_b, HttpReceiver(), ["*"])  # an endpoint somewhere: the one-time gate is open
    prov = factories.provider(tenant_a)
    factories.queued(tenant_a, prov, 4)
    prepared, _ = claim_and_start(4, lease_seconds=30)
    now = factories_now()
    recorded = record_outcomes([Outcome(p.lease, "delivered", Attempt(1, now, now, "delivered")) for p in prepared])
    assert len(recorded.ours) == 4 and recorded.batched == 0 and _outcome_batches() == []


def factories_now():
    from django.utils import timezone

    return timezone.now()


def _emitted(tenant, count=1) -> list[str]:
    return emit.emit(None, tenant.pk, "notification.delivered",
                     [{"notification_id": str(uuid.uuid4()), "status": "delivered"} for _ in range(count)])  # fmt: skip


@pytest.mark.parametrize("size", [2, 40])
def test_the_lane_claims_and_records_in_one_statement_each(tenant_a, django_assert_num_queries, size):
    endpoint(tenant_a, HttpReceiver(), ["*"])
    _emitted(tenant_a, size)
    token = uuid.uuid4()
    with django_assert_num_queries(1):
        claimed = deliveries.claim_due(100, 30, token)
    assert len(claimed) == size and {c.attempt for c in claimed} == {1}
    assert deliveries.claim_due(100, 30, uuid.uuid4()) == []  # leased: not claimed twice
    now = factories_now()
    results = [Result(c.delivery_id, token, "retry" if i % 2 else "delivered", 60, 503 if i % 2 else 200,
                      attempted_at=now) for i, c in enumerate(claimed)]  # fmt: skip
    with django_assert_num_queries(1):
        ours = deliveries.record(results)
    assert ours == {c.delivery_id for c in claimed}
    assert EventAttempt.objects.count() == size
    assert deliveries.record(results) == set()  # fenced by the lock token: a zombie's record changes nothing


def test_an_unbroken_run_of_failures_disables_the_endpoint_and_keeps_its_events(tenant_a):
    ep = endpoint(tenant_a, HttpReceiver(), ["*"])
    _emitted(tenant_a, 3)
    now = factories_now()

    def fail_one(kind="retry", status=503):
        (c,) = deliveries.claim_due(1, 30, token := uuid.uuid4())
        deliveries.record([Result(c.delivery_id, token, kind, 0, status, attempted_at=now)])

    fail_one()
    ep.refresh_from_db()
    assert ep.enabled and ep.failing_since is not None
    first = ep.failing_since
    fail_one()
    ep.refresh_from_db()
    assert ep.failing_since == first  # the run's start, not the latest failure
    # the run started long ago (the database clock is the rule's clock: move the run's start back)
    EventEndpoint.objects.filter(pk=ep.pk).update(failing_since=Now() - timedelta(hours=121))
    fail_one()
    ep.refresh_from_db()
    assert not ep.enabled and ep.disabled_reason == "failing without a break for 120 hours"
    # one event was fanned out (each claim of one took the failing delivery first)
    assert set(EventDelivery.objects.values_list("status", flat=True)) <= {"pending", "failed"}
    assert deliveries.claim_due(10, 30, uuid.uuid4()) == []  # never attempted while disabled
    assert Event.objects.count() == 3 and EventDelivery.objects.count() == 1  # kept, for `recover`
    assert not Event.objects.filter(fanout_pending=True).exists()


def test_a_success_ends_the_run(tenant_a):
    ep = endpoint(tenant_a, HttpReceiver(), ["*"])
    _emitted(tenant_a, 2)
    token = uuid.uuid4()
    a, b = deliveries.claim_due(2, 30, token)
    deliveries.record([Result(a.delivery_id, token, "retry", 0, 503, attempted_at=factories_now())])
    EventEndpoint.objects.filter(pk=ep.pk).update(failing_since=Now() - timedelta(hours=119))
    deliveries.record([Result(b.delivery_id, token, "delivered", 0, 200, attempted_at=factories_now())])
    ep.refresh_from_db()
    assert ep.enabled and ep.failing_since is None


def test_a_rotated_secret_signs_beside_the_old_one(tenant_a, settings):
    settings.OMNIPOST_SECRET_ROTATION_GRACE_SECONDS = 3600
    with HttpReceiver(secret=OTHER_SECRET, max_seconds=60) as old_rx:
        ep = endpoint(tenant_a, old_rx, ["*"])
        update_endpoint(ep, {"secret": TEST_SIGNING_SECRET}, actor="test")
        (event_id,) = _emitted(tenant_a)
        run_once()
        assert old_rx.wait_for(1)
        (request,) = old_rx.requests
        assert request.verified and request.webhook_id == event_id
        Webhook(TEST_SIGNING_SECRET).verify(request.body, request.headers)  # the new one verifies too


def _table_activity(cursor) -> dict[str, tuple[int, int, int]]:
    cursor.execute(
        "SELECT relname, seq_scan, coalesce(idx_scan, 0), n_tup_ins FROM pg_stat_xact_user_tables "
        "WHERE relname IN ('event_endpoints', 'events', 'event_deliveries')"
    )
    return {name: (seq, idx, ins) for name, seq, idx, ins in cursor.fetchall()}


def test_without_any_endpoint_the_record_statement_looks_once_and_writes_nothing(tenant_a):
    """The one-time gate: no endpoint anywhere, so the emission CTEs look at event_endpoints a few
    times per statement whatever its size (no probe per delivery) and write no event."""
    from django.db import connection, transaction

    prov = factories.provider(tenant_a)
    factories.queued(tenant_a, prov, 205)
    reads = []
    for size in (5, 200):
        prepared, _ = claim_and_start(size, lease_seconds=30)
        now = factories_now()
        with transaction.atomic(), connection.cursor() as cursor:
            record_outcomes([Outcome(p.lease, "delivered", Attempt(1, now, now, "delivered")) for p in prepared])
            activity = _table_activity(cursor)
        assert activity.get("events", (0, 0, 0))[2] == 0 and activity.get("event_deliveries", (0, 0, 0))[2] == 0
        reads.append(activity["event_endpoints"][:2])
    assert all(seq <= 8 and idx == 0 for seq, idx in reads), reads


def test_the_ssrf_guard_refuses_a_private_endpoint_at_send_time(tenant_a, settings):
    with HttpReceiver(secret=OTHER_SECRET, max_seconds=60) as events_rx:
        endpoint(tenant_a, events_rx, ["*"])  # saved while private destinations were allowed
        _emitted(tenant_a)
        settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
        run_once()
        assert events_rx.requests == []
    delivery = EventDelivery.objects.get()
    assert (delivery.status, delivery.last_error_code) == ("failed", "destination_forbidden")
    assert EventAttempt.objects.get().status == "failed"


def test_emit_notification_events_reads_the_notification_in_one_statement(tenant_a, tenant_b,
                                                                          django_assert_num_queries):
    with HttpReceiver(secret=OTHER_SECRET, max_seconds=60) as events_rx:
        endpoint(tenant_a, events_rx, ["notification.bounced"])
        prov = factories.provider(tenant_a, "mailer", kind="console")
        (note,) = factories.notifications(tenant_a, prov, 1, recipient="https://example.test/secret-path")
        (other,) = factories.notifications(tenant_b, factories.provider(tenant_b, kind="console"), 1)  # no endpoint
        items = [
            (note.id, "notification.bounced", {"receipt": "bounced", "bounce_type": "hard"}),
            (note.id, "notification.complained", {"receipt": "complained"}),  # not subscribed
            (other.id, "notification.bounced", {"receipt": "bounced", "bounce_type": "soft"}),
            (uuid.uuid4(), "notification.bounced", {}),  # unknown
        ]
        with django_assert_num_queries(1):
            ids = emit.emit_notification_events(None, items)
        assert len(ids) == 1
        run_once()
        assert events_rx.wait_for(1)
        (request,) = events_rx.requests
        assert request.verified and request.webhook_id == ids[0]
        assert request.payload["type"] == "notification.bounced"
        assert request.payload["data"] == {
            # as the notification was when the event was written
            "notification_id": str(note.id), "status": "queued", "receipt": "bounced", "bounce_type": "hard",
            "channel": "webhook", "recipient_masked": note.recipient_masked, "provider": "mailer",
            "attempt_count": 0, "error_code": None,
        }  # fmt: skip
        assert "secret-path" not in request.body.decode()
    with pytest.raises(ValueError, match="notification event type"):
        emit.emit_notification_events(None, [(note.id, "recipient.suppressed", {})])
