"""The console: DLQ list, detail timeline and actions, the dashboard and the queue admins — scoped to the
user's tenants, permission-checked, audited, and with query counts that do not grow with the data."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from core.management.commands.create_staff_user import operators_group
from core.models import AuditEvent, Tenant, TenantMembership
from dlq import admin as dlq_admin
from dlq import services
from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt, Notification
from queueing.models import QueueItem, ScheduledJob, Worker
from tests import factories
from tests.dlq.test_services import dead_letters

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/dlq/deadletter/"
EMAIL_A, EMAIL_B = "alice.smith@example.com", "bob.jones@example.org"


def login(username: str, *tenants: Tenant, operator: bool = True, superuser: bool = False) -> Client:
    User = get_user_model()  # noqa: N806
    if superuser:
        user = User.objects.create_superuser(username=username, password="x")
    else:
        user = User.objects.create_user(username=username, password="x", is_staff=True)
    if operator:
        user.groups.add(operators_group())
    for tenant in tenants:
        TenantMembership.objects.create(user=user, tenant=tenant)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def mail_a(tenant_a):  # noqa: ANN001, ANN201
    return factories.provider(tenant_a, "mail-a", channel="email")


@pytest.fixture
def mail_b(tenant_b):  # noqa: ANN001, ANN201
    return factories.provider(tenant_b, "mail-b", channel="email")


@pytest.fixture
def entries_a(tenant_a, mail_a):  # noqa: ANN001, ANN201
    return dead_letters(tenant_a, mail_a, 2, with_attempts=True, recipient=EMAIL_A)


@pytest.fixture
def entry_b(tenant_b, mail_b):  # noqa: ANN001, ANN201
    return dead_letters(tenant_b, mail_b, 1, recipient=EMAIL_B)[0]


@pytest.fixture
def staff_a(tenant_a) -> Client:  # noqa: ANN001
    return login("staff-a", tenant_a)


@pytest.fixture
def root() -> Client:
    return login("root", superuser=True, operator=False)


def listed(page: str) -> set[str]:
    """Notification ids in the changelist's rows."""
    return set(re.findall(r'<code title="([0-9a-f-]{36})">', page))


def html(response) -> str:  # noqa: ANN001
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def messages_of(response) -> list[str]:  # noqa: ANN001
    return [str(m) for m in response.context["messages"]]


# --- list -------------------------------------------------------------------------------------------


def test_staff_see_only_their_tenants_entries(staff_a, root, entries_a, entry_b):
    page = html(staff_a.get(CHANGELIST))
    assert all(str(e.notification_id) in page for e in entries_a)
    assert str(entry_b.notification_id) not in page and "tenant-b" not in page and "mail-b" not in page
    assert staff_a.get(f"{CHANGELIST}{entry_b.pk}/change/").status_code in (302, 404)
    assert listed(html(staff_a.get(f"{CHANGELIST}?q={entry_b.notification_id}"))) == set()
    everything = html(root.get(CHANGELIST))
    assert str(entry_b.notification_id) in everything and "By tenant" in everything


def test_open_by_default_with_filters_and_search(staff_a, tenant_a, mail_a, entries_a):
    permanent = dead_letters(tenant_a, factories.provider(tenant_a, "sms-a", channel="sms"), 1, status="failed",
                             failure_class="permanent", error_code="http_400")[0]  # fmt: skip
    services.discard([entries_a[1].pk], actor="user:someone")
    ids = listed
    default = html(staff_a.get(CHANGELIST))
    assert ids(default) == {str(entries_a[0].notification_id), str(permanent.notification_id)}
    assert ids(html(staff_a.get(f"{CHANGELIST}?status=all"))) == ids(default) | {str(entries_a[1].notification_id)}
    discarded = html(staff_a.get(f"{CHANGELIST}?status=discarded"))
    assert ids(discarded) == {str(entries_a[1].notification_id)} and "user:someone<br><small>20" in discarded
    assert ids(html(staff_a.get(f"{CHANGELIST}?failure_class__exact=permanent"))) == {str(permanent.notification_id)}
    assert ids(html(staff_a.get(f"{CHANGELIST}?provider=mail-a"))) == {str(entries_a[0].notification_id)}
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    created_today = {"created_at__gte": str(today), "created_at__lt": str(today + timedelta(days=1))}  # "Today"
    assert len(ids(html(staff_a.get(CHANGELIST, created_today)))) == 2
    assert ids(html(staff_a.get(f"{CHANGELIST}?q={permanent.notification_id}"))) == {str(permanent.notification_id)}
    assert ids(html(staff_a.get(f"{CHANGELIST}?q=no-such-id"))) == set()
    assert ids(html(staff_a.get(f"{CHANGELIST}?q={entries_a[0].pk}"))) == {str(entries_a[0].notification_id)}


def test_provider_filter_offers_only_visible_providers(staff_a, entries_a, entry_b):
    page = html(staff_a.get(CHANGELIST))
    assert "?provider=mail-a" in page and "?provider=mail-b" not in page


def _count_queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_changelist_queries_do_not_grow_with_rows(staff_a, root, tenant_a, mail_a):
    dead_letters(tenant_a, mail_a, 3)
    few = {who: _count_queries(client, CHANGELIST) for who, client in (("staff", staff_a), ("root", root))}
    dead_letters(tenant_a, mail_a, 60, with_attempts=True)
    dead_letters(tenant_a, factories.provider(tenant_a, "other"), 20)
    many = {who: _count_queries(client, CHANGELIST) for who, client in (("staff", staff_a), ("root", root))}
    assert few == many
    assert many["staff"] <= 10 and many["root"] <= 10


def test_changelist_count_is_capped_not_a_full_count(staff_a, tenant_a, mail_a, monkeypatch):
    from queueing import stats

    monkeypatch.setattr(stats.CappedCountPaginator, "cap", 5)
    dead_letters(tenant_a, mail_a, 8)
    with CaptureQueriesContext(connection) as ctx:
        page = html(staff_a.get(CHANGELIST))
    counts = [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT 6" in sql for sql in counts if "dead_letter_queue" in sql)
    assert any(q["sql"].startswith("EXPLAIN") for q in ctx.captured_queries)  # the planner's estimate past the cap
    assert "dead letters" in page


# --- detail -----------------------------------------------------------------------------------------


def test_detail_shows_the_whole_timeline_and_only_the_masked_recipient(staff_a, entries_a):
    entry = entries_a[0]
    page = html(staff_a.get(f"{CHANGELIST}{entry.pk}/change/"))
    assert "a***@example.com" in page and EMAIL_A not in page
    assert page.count('class="attempt"') == 3
    for n in (1, 2, 3):
        assert f'data-number="{n}"' in page
    assert "HTTPStatusError" in page and "http_503" in page and "12 ms" in page
    assert 'id="redrive-button"' in page and 'id="discard-button"' in page


def test_detail_queries_do_not_grow_with_attempts(staff_a, tenant_a, mail_a):
    short = dead_letters(tenant_a, mail_a, 1, attempts=1, with_attempts=True)[0]
    long = dead_letters(tenant_a, mail_a, 1, attempts=12, with_attempts=True)[0]
    assert _count_queries(staff_a, f"{CHANGELIST}{short.pk}/change/") == _count_queries(
        staff_a, f"{CHANGELIST}{long.pk}/change/"
    ) <= 10


# --- actions ----------------------------------------------------------------------------------------


def test_bulk_redrive_action_requeues_audits_and_reports_refusals(staff_a, entries_a):
    delivered = entries_a[1]
    Notification.objects.filter(pk=delivered.notification_id).update(status="delivered")
    response = staff_a.post(CHANGELIST, {"action": "redrive_selected", "_selected_action": [e.pk for e in entries_a]},
                            follow=True)  # fmt: skip
    texts = messages_of(response)
    assert "Redriven 1 entry." in texts
    assert any("1 not redriven" in t and "already delivered" in t for t in texts)
    assert DeadLetter.objects.get(pk=entries_a[0].pk).resolved_by == "user:staff-a"
    assert QueueItem.objects.filter(notification_id=entries_a[0].notification_id).count() == 1
    assert AuditEvent.objects.filter(action="dead_letter.redriven", actor="user:staff-a").count() == 1
    assert DeadLetter.objects.get(pk=delivered.pk).status == "open"


def test_bulk_discard_action(staff_a, entries_a):
    response = staff_a.post(CHANGELIST, {"action": "discard_selected", "_selected_action": [e.pk for e in entries_a]},
                            follow=True)  # fmt: skip
    assert "Discarded 2 entries." in messages_of(response)
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"discarded"}
    assert AuditEvent.objects.filter(action="dead_letter.discarded").count() == 2
    assert not QueueItem.objects.exists()


def test_single_buttons_redrive_then_refuse(staff_a, entries_a):
    entry = entries_a[0]
    response = staff_a.post(f"{CHANGELIST}{entry.pk}/redrive/", follow=True)
    assert "Redriven 1 entry." in messages_of(response)
    page = html(response)
    assert 'id="redrive-button"' not in page and "This entry is redriven by user:staff-a" in page
    again = staff_a.post(f"{CHANGELIST}{entry.pk}/redrive/", follow=True)
    assert any("no longer open" in t for t in messages_of(again))
    assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == 1
    assert staff_a.get(f"{CHANGELIST}{entry.pk}/redrive/").status_code == 405
    discard = staff_a.post(f"{CHANGELIST}{entries_a[1].pk}/discard/", follow=True)
    assert "Discarded 1 entry." in messages_of(discard)


def test_actions_need_the_redrive_permission(tenant_a, entries_a):
    viewer = login("viewer", tenant_a, operator=False)
    user = get_user_model().objects.get(username="viewer")
    user.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    page = html(viewer.get(CHANGELIST))
    assert "redrive_selected" not in page
    assert 'id="redrive-button"' not in html(viewer.get(f"{CHANGELIST}{entries_a[0].pk}/change/"))
    viewer.post(CHANGELIST, {"action": "redrive_selected", "_selected_action": [entries_a[0].pk]})
    assert viewer.post(f"{CHANGELIST}{entries_a[0].pk}/redrive/").status_code == 403
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"open"}
    assert not AuditEvent.objects.filter(action__startswith="dead_letter").exists()


def test_staff_cannot_act_on_another_tenants_entry(staff_a, entries_a, entry_b):
    assert staff_a.post(f"{CHANGELIST}{entry_b.pk}/redrive/").status_code == 404
    staff_a.post(CHANGELIST, {"action": "redrive_selected", "_selected_action": [entry_b.pk]})
    staff_a.post(CHANGELIST, {"action": "discard_selected", "_selected_action": [entry_b.pk]})
    assert DeadLetter.objects.get(pk=entry_b.pk).status == "open"
    assert not QueueItem.objects.exists()


def test_huge_selections_are_sent_to_the_paced_command(staff_a, entries_a, monkeypatch):
    monkeypatch.setattr(dlq_admin, "MAX_ACTION_ENTRIES", 1)
    response = staff_a.post(CHANGELIST, {"action": "redrive_selected", "select_across": "1", "index": "0",
                                         "_selected_action": [entries_a[0].pk]}, follow=True)  # fmt: skip
    assert any("dlq_redrive --rate" in t for t in messages_of(response))
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"open"}


# --- dashboard and queue admins ---------------------------------------------------------------------


@pytest.fixture
def busy(tenant_a, tenant_b, mail_a, mail_b, entries_a, entry_b):  # noqa: ANN001, ANN201
    """Queue items in several queues, last hour's attempts and workers, for both tenants."""
    factories.queued(tenant_a, mail_a, 4, priority=9, queue_name="alerts-a")
    factories.queued(tenant_a, mail_a, 2, priority=3, queue_name="default")
    factories.queued(tenant_b, mail_b, 5, priority=1, queue_name="bulk-b")
    Worker.objects.create(kind="dispatcher", host="web-1", pid=101, queues=["*"])
    stale = Worker.objects.create(kind="dispatcher", host="web-2", pid=202, queues=["bulk"])
    Worker.objects.filter(pk=stale.pk).update(last_seen=datetime.now(UTC) - timedelta(minutes=10))


def test_dashboard_is_linked_and_scoped_to_the_staff_members_tenants(staff_a, root, busy):
    assert "/admin/dashboard/" in html(staff_a.get("/admin/"))
    page = html(staff_a.get("/admin/dashboard/"))
    assert "alerts-a" in page and "bulk-b" not in page and "tenant-b" not in page
    assert 'id="card-depth"' in page and ">6<" in page  # tenant A's six items, not B's five
    assert "web-1:101" in page and "web-2:202" in page and "stale" in page and "live" in page
    assert "<svg" in page and "http" not in page.split('id="chart-deliveries"')[1].split("</svg>")[0]
    everything = html(root.get("/admin/dashboard/"))
    assert "bulk-b" in everything and ">11<" in everything


def test_dashboard_needs_the_operator_permission(tenant_a):
    nobody = login("nobody", tenant_a, operator=False)
    assert nobody.get("/admin/dashboard/").status_code == 403
    assert "/admin/dashboard/" not in html(nobody.get("/admin/"))
    assert Client().get("/admin/dashboard/").status_code == 302  # to the login page


def test_dashboard_queries_do_not_grow_with_data(staff_a, tenant_a, mail_a, busy):
    before = _count_queries(staff_a, "/admin/dashboard/")
    factories.queued(tenant_a, mail_a, 50, priority=7, queue_name="more")
    dead_letters(tenant_a, mail_a, 30, with_attempts=True)
    Worker.objects.create(kind="scheduler", host="web-3", pid=303)
    assert _count_queries(staff_a, "/admin/dashboard/") == before <= 12


def test_queue_admins_are_read_only_and_scoped(staff_a, root, tenant_a, busy):
    items = html(staff_a.get("/admin/queueing/queueitem/"))
    assert "alerts-a" in items and "bulk-b" not in items
    assert "bulk-b" in html(root.get("/admin/queueing/queueitem/"))
    assert "alerts-a" in html(staff_a.get("/admin/queueing/queueitem/?state=ready&priority=9"))
    assert "alerts-a" not in html(staff_a.get("/admin/queueing/queueitem/?priority=1"))
    note = Notification.objects.filter(tenant=tenant_a, queue="alerts-a").first()
    assert str(note.pk) in html(staff_a.get(f"/admin/queueing/queueitem/?q={note.pk}"))
    assert staff_a.get("/admin/queueing/queueitem/add/").status_code == 403
    workers = html(staff_a.get("/admin/queueing/worker/"))
    assert "web-1:101" in workers
    assert "column-host" in workers and "column-pid" in workers  # one host's pid is not another's
    assert 'class="field-host">web-1<' in workers and 'class="field-pid">101<' in workers
    job_note = factories.notifications(tenant_a, factories.provider(tenant_a, "later"), 1, status="scheduled")[0]
    ScheduledJob.objects.create(tenant=tenant_a, notification_id=job_note.pk,
                                run_at=datetime.now(UTC) + timedelta(hours=1))
    jobs = html(staff_a.get("/admin/queueing/scheduledjob/"))
    assert str(job_note.pk) in jobs
    assert str(job_note.pk) not in html(login("staff-b", Tenant.objects.get(name="tenant-b")).get(
        "/admin/queueing/scheduledjob/"))  # fmt: skip


def test_attempts_in_the_last_hour_feed_the_chart(staff_a, tenant_a, mail_a, busy):
    note = Notification.objects.filter(tenant=tenant_a).first()
    now = datetime.now(UTC)
    DeliveryAttempt.objects.bulk_create(
        [
            DeliveryAttempt(tenant=tenant_a, notification=note, number=100 + i, provider=mail_a,
                            outcome="delivered" if i % 3 else "permanent_error",
                            started_at=now - timedelta(minutes=i), finished_at=now - timedelta(minutes=i))
            for i in range(30)
        ]  # fmt: skip
    )
    page = html(staff_a.get("/admin/dashboard/"))
    chart = page.split('id="chart-deliveries"')[1].split("</svg>")[0]
    assert chart.count("<rect") == 60 and "20</strong>" in page.split('id="chart-deliveries"')[1]
