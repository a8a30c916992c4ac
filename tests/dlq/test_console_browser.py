"""The console in a real browser: Debian's chromium driven through Playwright against the live server.

A staff member of tenant A logs in, filters the DLQ, redrives an entry whose deliveries had failed, and
sees it delivered once the dispatcher has run; tenant B's entries never reach the page. The dashboard is
saved to test-artifacts/dashboard.png (and the entry's timeline to test-artifacts/dlq-detail.png).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from dispatch.dispatcher import Dispatcher, DispatcherConfig
from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt, Notification
from queueing.models import QueueItem, Worker
from tests import factories
from tests.dlq.test_services import dead_letters
from tests.support.fixtures import signing_secret, webhook_receiver  # noqa: F401
from tests.support.receivers import TEST_SIGNING_SECRET

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
ARTIFACTS = Path(settings.BASE_DIR) / "test-artifacts"
PASSWORD = "console-Pa55word-42"


def dispatch_once() -> None:
    """The in-process dispatcher for the `default` queue (the dashboard's filler sits in other queues), on
    its own thread: Playwright's sync API owns this thread's event loop."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            # Off the main thread the dispatcher runs without signal handlers.
            config = DispatcherConfig(queues=["default"], once=True, jitter=False)
            assert asyncio.run(Dispatcher(config).main()) == 0
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            failures.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name="dispatcher")
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and not failures, failures


@contextlib.contextmanager
def chromium_page(width: int, height: int) -> Iterator:
    """A page of Debian's chromium at this viewport, for a test that also uses the ORM between steps."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop on this thread; the ORM calls the test makes between
    # browser steps are ordinary synchronous code, so Django's async-context guard is lifted here only.
    # Django keeps connections per context; Playwright's greenlets change the context, so close what the
    # outer context opened now, and what the inner one opened on the way out (no session outlives the test).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        connections.close_all()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            context = browser.new_context(viewport={"width": width, "height": height}, locale="en-US")
            context.set_default_timeout(15_000)
            try:
                yield context.new_page()
            finally:
                context.close()
                browser.close()
                connections.close_all()


@pytest.fixture
def browser_page() -> Iterator:
    with chromium_page(1440, 1000) as page:
        yield page


def staff_user(username: str, tenant_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real command: `create_staff_user USERNAME --tenant T --password-stdin`."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORD + "\n"))
    call_command("create_staff_user", username, "--tenant", tenant_name, "--password-stdin", stdout=io.StringIO())


def busy_console(tenant_a, tenant_b) -> None:  # noqa: ANN001
    """Enough going on that the dashboard shows what an ops person would see mid-incident."""
    mail = factories.provider(tenant_a, "mail-a", channel="email")
    for queue_name, priority, count in (("alerts", 9, 14), ("alerts", 7, 6), ("bulk", 5, 48), ("digest", 1, 23)):
        factories.queued(tenant_a, mail, count, priority=priority, queue_name=queue_name)
    QueueItem.objects.filter(queue_name="bulk").update(enqueued_at=datetime.now(UTC) - timedelta(seconds=95))
    factories.queued(tenant_b, factories.provider(tenant_b, "bulk-b"), 30, queue_name="tenant-b-bulk")
    note = Notification.objects.filter(tenant=tenant_a).first()
    now = datetime.now(UTC)
    attempts = []
    for minute in range(60):
        recent = minute < 12  # a provider started failing twelve minutes ago
        delivered = 8 + minute % 5 if recent else 40 + (minute * 7) % 35
        failed = 6 + minute % 4 if recent else minute % 3 // 2
        for i in range(delivered + failed):
            at = now - timedelta(minutes=minute, seconds=i % 50)
            attempts.append(DeliveryAttempt(
                tenant=tenant_a, notification=note, number=1000 + len(attempts), provider=mail, started_at=at,
                finished_at=at, outcome="delivered" if i < delivered else "transient_error", duration_ms=40,
            ))  # fmt: skip
    DeliveryAttempt.objects.bulk_create(attempts, batch_size=2000)
    Worker.objects.create(kind="dispatcher", host="ops-1", pid=4101, queues=["*"], processed=18_204)
    Worker.objects.create(kind="scheduler", host="ops-1", pid=4102, processed=311)
    stale = Worker.objects.create(kind="dispatcher", host="ops-2", pid=977, queues=["alerts"], processed=5_120)
    Worker.objects.filter(pk=stale.pk).update(last_seen=now - timedelta(minutes=4))


def test_staff_filters_redrives_and_sees_it_delivered(
    live_server, browser_page, webhook_receiver, tenant_a, tenant_b, monkeypatch, settings  # noqa: F811
):
    settings.OMNIPOST_RETRY_BASE_SECONDS = 0.05
    settings.OMNIPOST_RETRY_MAX_SECONDS = 0.1
    page = browser_page
    # Tenant A's webhook failed twice (503) and was dead-lettered; its permanent failure sits beside it.
    hook = factories.provider(tenant_a, "hook-a", config={"url": webhook_receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, max_attempts=2)  # fmt: skip
    webhook_receiver.configure(status=503)
    (note,) = factories.queued(tenant_a, hook, 1)
    for _ in range(40):
        dispatch_once()
        note.refresh_from_db()
        if note.status == "dead_lettered":
            break
    assert note.status == "dead_lettered"
    assert DeadLetter.objects.get(notification=note).status == "open"
    permanent = dead_letters(tenant_a, factories.provider(tenant_a, "sms-a", channel="sms"), 1, status="failed",
                             failure_class="permanent", error_code="http_400", recipient="+15551234567")[0]  # fmt: skip
    theirs = dead_letters(tenant_b, factories.provider(tenant_b, "hook-b"), 2)
    busy_console(tenant_a, tenant_b)
    staff_user("ops-a", "tenant-a", monkeypatch)
    webhook_receiver.configure(status=200)  # the provider has recovered

    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "ops-a")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#ops-dashboard-link")

    page.click("#ops-dashboard-link >> text=Dead-letter queue")
    page.wait_for_selector("#result_list")
    listing = page.content()
    assert str(note.pk) in listing and str(permanent.notification_id) in listing
    assert all(str(e.notification_id) not in listing for e in theirs) and "tenant-b" not in listing

    page.locator("#changelist-filter").get_by_role("link", name="Transient").click()
    page.wait_for_url("**failure_class__exact=transient**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and rows.first.locator("code").get_attribute("title") == str(note.pk)
    assert str(permanent.notification_id) not in page.content()

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dlq-list.png"))
    rows.first.locator("input.action-select").check()
    page.select_option("select[name=action]", "redrive_selected")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    assert "Redriven 1 entry." in page.locator("ul.messagelist").inner_text()

    dispatch_once()  # the dispatcher picks the redriven notification up
    page.goto(f"{live_server.url}/admin/dlq/deadletter/?status=all&failure_class__exact=transient")
    row = f'#result_list tr:has(code[title="{note.pk}"])'
    badge = page.locator(f'{row} .dlq-badge[data-value="delivered"]')
    assert badge.count() == 1

    page.locator(f"{row} th a").click()
    page.wait_for_selector("#dlq-timeline")
    outcomes = page.locator("#dlq-timeline tr.attempt").evaluate_all("rows => rows.map(r => r.dataset.outcome)")
    assert outcomes == ["transient_error", "transient_error", "delivered"]
    assert page.locator("#recipient-masked").inner_text() == note.recipient_masked
    assert "https://example.test/hook" not in page.content()  # the clear recipient never reaches the page
    assert "This entry is redriven by user:ops-a" in page.locator("#dlq-actions").inner_text()
    page.screenshot(path=str(ARTIFACTS / "dlq-detail.png"), full_page=True)
    assert webhook_receiver.stats()["accepted"] == 1  # delivered exactly once
    note.refresh_from_db()
    assert note.status == "delivered"

    # Tenant B's entry is not reachable by guessing its URL either.
    page.goto(f"{live_server.url}/admin/dlq/deadletter/{theirs[0].pk}/change/")
    assert str(theirs[0].notification_id) not in page.content()
    assert "/admin/dlq/deadletter/" not in page.url or "change" not in page.url or "doesn’t exist" in page.content()
    page.goto(f"{live_server.url}/admin/dlq/deadletter/?status=all&q={theirs[0].notification_id}")
    assert page.locator("#result_list").count() == 0 or page.locator("#result_list tbody tr").count() == 0

    # The dashboard, as an ops person sees it; tenant B's queue is not on it.
    page.goto(f"{live_server.url}/admin/")
    page.click("#ops-dashboard-link >> text=Operations dashboard")
    page.wait_for_selector("#queue-table")
    dashboard = page.content()
    assert "alerts" in dashboard and "digest" in dashboard and "tenant-b-bulk" not in dashboard
    assert page.locator("#card-depth .value").inner_text() == "91"
    assert page.locator("#card-dlq .value").inner_text() == "1"  # the permanent one is still open
    assert page.locator("#worker-table .badge.stale").count() == 1
    assert page.locator("#chart-deliveries rect").count() == 60
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000


def test_a_staff_member_of_tenant_a_never_sees_tenant_b(live_server, browser_page, tenant_a, tenant_b, monkeypatch):
    page = browser_page
    mine = dead_letters(tenant_a, factories.provider(tenant_a, "hook-a"), 2)
    theirs = dead_letters(tenant_b, factories.provider(tenant_b, "hook-b"), 3)
    factories.queued(tenant_b, factories.provider(tenant_b, "other-b"), 5, queue_name="only-b")
    staff_user("ops-a2", "tenant-a", monkeypatch)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "ops-a2")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#ops-dashboard-link")
    for path in ("/admin/dlq/deadletter/?status=all", "/admin/dashboard/", "/admin/queueing/queueitem/",
                 "/admin/core/tenant/", f"/admin/dlq/deadletter/?q={theirs[0].notification_id}"):  # fmt: skip
        page.goto(live_server.url + path)
        text = page.content()
        assert "tenant-b" not in text and "only-b" not in text and "hook-b" not in text, path
        assert all(str(e.notification_id) not in text for e in theirs[1:]), path
    page.goto(f"{live_server.url}/admin/dlq/deadletter/?status=all")
    assert page.locator("#result_list tbody tr").count() == len(mine)
    # Tenant B's provider is not even offered as a filter.
    assert page.locator("#changelist-filter").get_by_role("link", name="hook-b").count() == 0
    assert uuid.UUID(page.locator("#result_list tbody tr code").first.get_attribute("title"))
