"""apply_receipts: precedence, de-duplication, tenant isolation and its fixed statement count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifications.models import Notification
from receipts import precedence
from receipts.models import NotificationEvent, ReceiptCounter, ReceiptDedup
from receipts.services import apply_receipts, ignored_totals
from tests import factories
from tests.receipts.conftest import receipt

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


# --- the rule itself ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("current", "reported", "shown"),
    [
        ((None, None), [("delivered", None)], ("delivered", None)),
        ((None, None), [("bounced", "hard"), ("delivered", None)], ("bounced", "hard")),
        ((None, None), [("delivered", None), ("bounced", "hard")], ("bounced", "hard")),
        (("bounced", "soft"), [("delivered", None)], ("bounced", "soft")),
        (("bounced", "soft"), [("bounced", "hard")], ("bounced", "hard")),
        (("bounced", "hard"), [("bounced", "soft")], ("bounced", "hard")),
        (("bounced", None), [("bounced", "soft")], ("bounced", "soft")),
        (("delivered", None), [("undelivered", None)], ("undelivered", None)),
        (("undelivered", None), [("failed", None)], ("failed", None)),
        (("failed", None), [("undelivered", None), ("delivered", None)], ("failed", None)),
        (("failed", None), [("bounced", "soft")], ("bounced", "soft")),
        (("bounced", "hard"), [("complained", None)], ("complained", None)),
        (("complained", None), [("bounced", "hard"), ("delivered", None)], ("complained", None)),
        (("delivered", None), [(None, None)], ("delivered", None)),  # queued/sent/deferred: no receipt
        ((None, None), [(None, None)], (None, None)),
    ],
)
def test_precedence_table(current, reported, shown):
    assert precedence.settle(current, reported) == shown
    assert precedence.settle(current, list(reversed(reported))) == shown  # any order, same result


def test_the_sql_and_python_rank_keys_agree():
    assert precedence.key("bounced", "hard") == "bounced:hard" and precedence.key("bounced", None) == "bounced"
    assert [precedence.rank(*k.split(":")) if ":" in k else precedence.rank(k) for k in precedence.ORDER] == list(
        range(1, len(precedence.ORDER) + 1)
    )


# --- applying ---------------------------------------------------------------------------------------
def shown(note: Notification) -> tuple[str | None, str | None]:
    note.refresh_from_db(fields=["receipt", "bounce_type"])
    return note.receipt, note.bounce_type


def test_receipts_become_events_and_the_highest_rank_shows(side_a):
    first, second, third = side_a.notes
    result = apply_receipts(side_a.view, [
        receipt(first, "bounced", bounce_type="hard", at=T0),
        receipt(first, "delivered", at=T0 + timedelta(minutes=1)),  # later, yet lower: stays bounced
        receipt(second, None, type="sent", at=T0),
        receipt(second, "delivered", at=T0 + timedelta(seconds=5)),
        receipt(third, "failed", at=T0, details={"error": "to jane.doe@example.com", "api_token": "tok-1234567890"}),
    ])  # fmt: skip
    assert (result.applied, result.duplicate, result.ignored) == (5, 0, 0)
    assert shown(first) == ("bounced", "hard")
    assert shown(second) == ("delivered", None)
    assert shown(third) == ("failed", None)
    assert {(c.notification_id, c.receipt, c.bounce_type) for c in result.changed} == {
        (first.pk, "bounced", "hard"), (second.pk, "delivered", None), (third.pk, "failed", None)
    }
    assert {c.channel for c in result.changed} == {"webhook"}
    assert {c.provider_id for c in result.changed} == {side_a.provider.pk}
    assert {c.tenant_id for c in result.changed} == {side_a.tenant.pk}
    events = list(NotificationEvent.objects.filter(notification=second).order_by("occurred_at"))
    assert [(e.type, e.receipt) for e in events] == [("sent", None), ("delivered", "delivered")]
    stored = NotificationEvent.objects.get(notification=third).details
    assert stored == {"error": "to j***@example.com", "api_token": "****7890"}  # masked on the way in

    # Later: delivered after bounced changes nothing; a complaint outranks the bounce.
    result = apply_receipts(side_a.view, [receipt(first, "delivered"), receipt(third, "delivered")])
    assert result.applied == 2 and result.changed == ()
    assert shown(first) == ("bounced", "hard") and shown(third) == ("failed", None)
    result = apply_receipts(side_a.view, [receipt(first, "complained")])
    assert shown(first) == ("complained", None) and [c.receipt for c in result.changed] == ["complained"]


def test_the_same_event_twice_is_one_event(side_a):
    note = side_a.notes[0]
    twice = receipt(note, "bounced", bounce_type="soft", event_id="evt-1")
    first = apply_receipts(side_a.view, [twice, twice])  # within one request
    assert (first.applied, first.duplicate) == (1, 0) and first.received == 1
    again = apply_receipts(side_a.view, [twice])
    assert (again.applied, again.duplicate, again.changed) == (0, 1, ())
    assert NotificationEvent.objects.filter(notification=note).count() == 1
    # Without an event id, the raw bytes' hash is the key.
    raw = receipt(note, "delivered", event_id="")
    raw = type(raw)(**{**{f: getattr(raw, f) for f in raw.__slots__}, "raw": b'{"x": 1}'})
    assert apply_receipts(side_a.view, [raw]).applied == 1
    assert apply_receipts(side_a.view, [raw]).duplicate == 1
    assert ReceiptDedup.objects.filter(provider_id=side_a.provider.pk).count() == 2


def test_another_tenants_or_unknown_notifications_are_ignored_and_counted(side_a, side_b):
    theirs = side_b.notes[0]
    result = apply_receipts(side_a.view, [
        receipt(theirs, "bounced", bounce_type="hard"),
        receipt("00000000-0000-0000-0000-000000000000", "delivered"),
        receipt("not-a-uuid", "delivered"),
        receipt(side_a.notes[0], "delivered"),
    ])  # fmt: skip
    assert (result.applied, result.duplicate, result.ignored) == (1, 0, 3)
    assert shown(theirs) == (None, None)
    assert not NotificationEvent.objects.filter(notification=theirs).exists()
    assert ignored_totals() == {(side_a.provider.pk, "foreign"): 1, (side_a.provider.pk, "unknown"): 2}
    apply_receipts(side_a.view, [receipt(theirs, "delivered")])
    assert ignored_totals()[(side_a.provider.pk, "foreign")] == 2
    # An ignored event leaves no key behind: it cannot block the owner's provider.
    assert not ReceiptDedup.objects.exclude(provider_id=side_a.provider.pk).exists()


def test_a_provider_changed_since_its_view_was_read_stores_nothing(side_a):
    view = side_a.view
    side_a.provider.save()  # updated_at moves
    result = apply_receipts(view, [receipt(side_a.notes[0], "delivered"), receipt("unknown", "delivered")])
    assert result.stale and result.applied == 0
    assert not NotificationEvent.objects.exists() and not ReceiptDedup.objects.exists()
    assert not ReceiptCounter.objects.exists()


@pytest.mark.parametrize("size", [1, 50, 500])
def test_one_statement_whatever_the_batch(side_a, tenant_b, size):
    prov = side_a.provider
    notes = factories.notifications(side_a.tenant, prov, size, status="delivered")
    view = side_a.view
    batch = [receipt(n, "bounced", bounce_type="hard") for n in notes] + [receipt("x", "delivered")]
    with CaptureQueriesContext(connection) as ctx:
        result = apply_receipts(view, batch)
    # the apply, then its follow-up's events (receipts.followups; a webhook address is never suppressed)
    assert len(ctx.captured_queries) == 2, [q["sql"][:80] for q in ctx.captured_queries]
    assert "notification_events" in ctx.captured_queries[0]["sql"]
    assert result.applied == size and result.ignored == 1 and len(result.changed) == size
    assert Notification.objects.filter(pk__in=[n.pk for n in notes], receipt="bounced").count() == size


def test_adapters_mistakes_are_errors_not_data(side_a):
    with pytest.raises(ValueError, match="receipt must be"):
        apply_receipts(side_a.view, [receipt(side_a.notes[0], "opened")])
    with pytest.raises(ValueError, match="bounce_type"):
        apply_receipts(side_a.view, [receipt(side_a.notes[0], "bounced", bounce_type="permanent")])
    with pytest.raises(ValueError, match="aware"):
        apply_receipts(side_a.view, [receipt(side_a.notes[0], "delivered", at=datetime(2026, 1, 1))])  # noqa: DTZ001


def test_nul_characters_from_a_vendor_are_dropped_not_an_error(side_a):
    note = side_a.notes[0]
    result = apply_receipts(side_a.view, [receipt(note, "failed", type="fail\x00ed", details={"d\x00": ["x\x00y"]})])
    assert result.applied == 1
    stored = NotificationEvent.objects.get(notification=note)
    assert stored.type == "failed" and stored.details == {"d": ["xy"]}


@pytest.mark.django_db(transaction=True)
def test_after_apply_hooks_get_the_changed_rows_inside_the_transaction(side_a, monkeypatch):
    from receipts import services

    seen = []

    def hook(provider, result):  # noqa: ANN001
        assert connection.in_atomic_block
        seen.append([(c.notification_id, c.receipt, c.bounce_type) for c in result.changed])

    monkeypatch.setattr(services, "AFTER_APPLY", [hook])
    note = side_a.notes[0]
    apply_receipts(side_a.view, [receipt(note, "bounced", bounce_type="hard")])
    apply_receipts(side_a.view, [receipt(note, "delivered")])  # changes nothing: no call
    assert seen == [[(note.pk, "bounced", "hard")]]

    def failing(provider, result):  # noqa: ANN001
        raise RuntimeError("suppression failed")

    monkeypatch.setattr(services, "AFTER_APPLY", [failing])
    with pytest.raises(RuntimeError):
        apply_receipts(side_a.view, [receipt(side_a.notes[1], "complained")])
    assert shown(side_a.notes[1]) == (None, None)  # rolled back with the hook
    assert not NotificationEvent.objects.filter(notification=side_a.notes[1]).exists()
