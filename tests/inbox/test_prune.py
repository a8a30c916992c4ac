"""`manage.py prune` and the feeds: an item past its notification's `ttl_seconds` goes, and so do items
read or archived before the retention cutoff; unread items stay however old. The subscribers' counts
follow in the same statement (the inbox_items delete trigger) and the open streams are told."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from inbox import live, statements
from inbox.models import InboxCounts, InboxItem
from tests.inbox.support import notify, subscriber
from tests.queueing.dispatch_support import drain

OLD = timezone.now() - timedelta(days=40)


def stored_counts(tenant, external_id: str) -> tuple[int, int, int]:  # noqa: ANN001
    row = InboxCounts.objects.for_tenant(tenant).get(subscriber=external_id)
    return row.unseen, row.unread, row.total


def counted(tenant, external_id: str) -> tuple[int, int, int]:  # noqa: ANN001
    """The counts as the items are (what statements.recount would write)."""
    items = InboxItem.objects.for_tenant(tenant).filter(subscriber=external_id, archived_at__isnull=True)
    return (items.filter(seen_at__isnull=True).count(), items.filter(read_at__isnull=True).count(), items.count())


def prune() -> str:
    out = io.StringIO()
    call_command("prune", "--older-than", "30", "--batch-size", "100", stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_ttl_seconds_is_checked_for_in_app(api_a):
    subscriber(api_a)
    for value in (-1, "60", True, 31_536_001):
        made = api_a.post("/api/v1/notifications", {"channel": "in_app", "subscriber": "jane", "body": "b",
                                                    "ttl_seconds": value}, format="json")  # fmt: skip
        assert made.status_code == 400, (value, made.content)
        assert made.json()["error"]["details"]["ttl_seconds"] == ["must be an integer from 0 to 31536000"]


@pytest.mark.django_db
def test_read_or_archived_items_past_retention_go_unread_ones_stay_and_counts_follow(tenant_a, tenant_b):
    def item(tenant, external_id: str, **states: object) -> uuid.UUID:  # noqa: ANN001
        made = InboxItem.objects.create(id=uuid.uuid4(), tenant=tenant, subscriber=external_id,
                                        notification_id=uuid.uuid4(), created_at=OLD, **states)  # fmt: skip
        statements.recount(tenant.pk, external_id)
        return made.id

    recent = timezone.now()
    gone = [
        item(tenant_a, "jane", seen_at=OLD, read_at=OLD),
        item(tenant_a, "jane", archived_at=OLD),  # archived unread: not in the counts
        item(tenant_a, "jane", seen_at=OLD, read_at=OLD, archived_at=recent),
        item(tenant_b, "jane", seen_at=OLD, read_at=OLD),
    ]
    kept = [
        item(tenant_a, "jane"),  # unread, however old
        item(tenant_a, "jane", seen_at=OLD),  # seen but unread
        item(tenant_a, "jane", seen_at=recent, read_at=recent),  # read within retention
        item(tenant_a, "joe", archived_at=recent),
        item(tenant_b, "jane"),
    ]
    assert stored_counts(tenant_a, "jane") == (1, 2, 4)

    assert "would delete" in _dry_run() and "4 inbox item(s)" in _dry_run()  # and deletes nothing
    assert InboxItem.objects.count() == 9
    assert "4 inbox item(s)" in prune()

    assert set(InboxItem.objects.values_list("id", flat=True)) == set(kept)
    assert not InboxItem.objects.filter(id__in=gone).exists()
    for tenant, external_id in ((tenant_a, "jane"), (tenant_a, "joe"), (tenant_b, "jane")):
        assert stored_counts(tenant, external_id) == counted(tenant, external_id)
    assert stored_counts(tenant_a, "jane") == (1, 2, 3)
    assert stored_counts(tenant_b, "jane") == (1, 1, 1)
    assert "0 inbox item(s)" in prune()


def _dry_run() -> str:
    out = io.StringIO()
    call_command("prune", "--older-than", "30", "--dry-run", stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_items_past_their_ttl_go_and_the_streams_are_told(api_a, tenant_a, subprocess_env, tmp_path):
    subscriber(api_a)
    subscriber(api_a, "joe")
    expired = notify(api_a, subject="flash sale", ttl_seconds=0)
    later = notify(api_a, subject="in an hour", ttl_seconds=3600)
    forever = notify(api_a, subject="no ttl")
    for_joe = notify(api_a, "joe", subject="joe's", ttl_seconds=0)
    drain(subprocess_env, tmp_path / "run")

    items = {str(i.notification_id): i for i in InboxItem.objects.all()}
    assert items[expired].expires_at == items[expired].created_at
    assert items[later].expires_at == items[later].created_at + timedelta(seconds=3600)
    assert items[forever].expires_at is None
    assert stored_counts(tenant_a, "jane") == (3, 3, 3)

    with psycopg.connect(_dsn(), autocommit=True) as listener:
        listener.execute(f"LISTEN {live.CHANNEL}")
        assert "2 inbox item(s)" in prune()
        told = {key for note in listener.notifies(timeout=2) for key in note.payload.split(",")}
    assert told == {live.subscriber_key(tenant_a.pk, "jane"), live.subscriber_key(tenant_a.pk, "joe")}

    assert {str(n) for n in InboxItem.objects.values_list("notification_id", flat=True)} == {later, forever}
    assert stored_counts(tenant_a, "jane") == counted(tenant_a, "jane") == (2, 2, 2)
    assert stored_counts(tenant_a, "joe") == (0, 0, 0)
    assert for_joe not in {str(n) for n in InboxItem.objects.values_list("notification_id", flat=True)}


def _dsn() -> str:
    settings = connection.settings_dict
    return (f"host={settings['HOST'] or '127.0.0.1'} port={settings['PORT'] or 5432} dbname={settings['NAME']} "
            f"user={settings['USER']} password={settings['PASSWORD']}")  # fmt: skip
