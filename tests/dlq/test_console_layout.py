"""The console reads well at 1280 px: chromium (Debian's, through Playwright) against the live server.

The admin index, the dashboard, the DLQ list and a DLQ entry, as a superuser and as a staff member of
one tenant: no page scrolls sideways (document.scrollingElement.scrollWidth <= innerWidth), every
visible link's box is wider than tall (none rendered one letter per line), the DLQ list's last column
ends inside the page, and a dead-lettered notification's last attempt reads `dead lettered`, not
`retrying`. Screenshots go to test-artifacts/layout-*.png.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model

from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt
from queueing.models import QueueItem, Worker
from tests import factories
from tests.dlq.test_console_browser import ARTIFACTS, PASSWORD, chromium_page, staff_user
from tests.dlq.test_services import dead_letters

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

WIDTH, HEIGHT = 1280, 900

# Every visible link: its box, unless it is an icon-sized one (the header's theme toggle has no text).
LINK_BOXES = """() => [...document.querySelectorAll('a')].filter(a => a.offsetParent !== null).map(a => {
    const r = a.getBoundingClientRect();
    return {text: a.innerText.trim(), href: a.getAttribute('href'), w: r.width, h: r.height};
}).filter(b => b.text.length > 1 && b.w > 0)"""
OVERFLOW = "() => [document.scrollingElement.scrollWidth, window.innerWidth]"
LAST_COLUMN = """() => {
    const cells = [...document.querySelectorAll('#result_list thead th')];
    const last = cells[cells.length - 1].getBoundingClientRect();
    const box = document.querySelector('#changelist .results').getBoundingClientRect();
    return [last.right, Math.min(box.right, window.innerWidth)];
}"""


@pytest.fixture
def page() -> Iterator:
    with chromium_page(WIDTH, HEIGHT) as opened:
        yield opened


def incident(tenant_a, tenant_b) -> DeadLetter:  # noqa: ANN001
    """A provider failing: a dead-lettered notification with its three 503s, more open entries (long
    error codes and provider names, a resolved one), a backlog in four queues, workers."""
    hook = factories.provider(tenant_a, "billing-webhooks-eu-west", max_attempts=3)
    (entry,) = dead_letters(tenant_a, hook, 1, attempts=3, with_attempts=True)
    dead_letters(tenant_a, factories.provider(tenant_a, "sms-twilio-marketing", channel="sms"), 6,
                 status="failed", failure_class="permanent", error_code="destination_forbidden",
                 recipient="+15551234567")  # fmt: skip
    resolved = dead_letters(tenant_b, factories.provider(tenant_b, "hook-b"), 4)
    DeadLetter.objects.filter(pk__in=[e.pk for e in resolved[:2]]).update(
        status="redriven", resolved_at=datetime.now(UTC), resolved_by="user:someone-with-a-long-name"
    )
    for queue_name, priority, count in (("alerts", 9, 12), ("bulk-newsletters", 3, 40), ("default", 5, 8)):
        factories.queued(tenant_a, hook, count, priority=priority, queue_name=queue_name)
    factories.queued(tenant_b, factories.provider(tenant_b, "bulk-b"), 15, queue_name="tenant-b-digest")
    QueueItem.objects.filter(queue_name="bulk-newsletters").update(enqueued_at=datetime.now(UTC) - timedelta(minutes=7))
    (note,) = factories.notifications(tenant_a, hook, 1, status="delivered")  # the last hour's traffic
    now = datetime.now(UTC)
    DeliveryAttempt.objects.bulk_create([
        DeliveryAttempt(tenant=tenant_a, notification=note, number=100 + i, provider=hook,
                        started_at=now - timedelta(minutes=i % 60), finished_at=now - timedelta(minutes=i % 60),
                        outcome="delivered" if i % 5 else "transient_error", duration_ms=30)
        for i in range(600)
    ])  # fmt: skip
    Worker.objects.create(kind="dispatcher", host="ops-1", pid=4101, queues=["*"], processed=18_204)
    Worker.objects.create(kind="scheduler", host="ops-1", pid=4102, processed=311)
    return entry


def log_in(page, base: str, username: str) -> None:  # noqa: ANN001
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#ops-dashboard-link")


def check_layout(page, name: str) -> list[str]:  # noqa: ANN001
    """Screenshot the page; what is wrong with its layout."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"layout-{name}.png"), full_page=True)
    problems = []
    scroll_width, inner_width = page.evaluate(OVERFLOW)
    if scroll_width > inner_width:
        problems.append(f"{name}: scrolls sideways ({scroll_width} > {inner_width})")
    for box in page.evaluate(LINK_BOXES):
        if box["w"] <= box["h"]:
            problems.append(f"{name}: link {box['text']!r} ({box['href']}) is {box['w']:.0f}×{box['h']:.0f}")
    return problems


def test_console_pages_read_well_at_1280(live_server, page, tenant_a, tenant_b, monkeypatch):
    entry = incident(tenant_a, tenant_b)
    get_user_model().objects.create_superuser("root", "root@example.test", PASSWORD)
    staff_user("ops-a", "tenant-a", monkeypatch)
    problems = []
    for username in ("root", "ops-a"):
        page.context.clear_cookies()
        log_in(page, live_server.url, username)
        problems += check_layout(page, f"index-{username}")
        links = page.locator("#ops-dashboard-link a")
        assert links.count() == 2 and links.nth(0).inner_text() == "Operations dashboard"

        page.click("#ops-dashboard-link >> text=Operations dashboard")
        page.wait_for_selector("#queue-table")
        problems += check_layout(page, f"dashboard-{username}")

        page.goto(f"{live_server.url}/admin/dlq/deadletter/?status=all")
        page.wait_for_selector("#result_list")
        problems += check_layout(page, f"dlq-list-{username}")
        right, edge = page.evaluate(LAST_COLUMN)
        if right > edge + 1:
            problems.append(f"dlq list ({username}): the last column ends at {right:.0f}px, past {edge:.0f}px")

        page.goto(f"{live_server.url}/admin/dlq/deadletter/{entry.pk}/change/")
        page.wait_for_selector("#dlq-timeline")
        problems += check_layout(page, f"dlq-entry-{username}")
        badges = page.locator("#dlq-timeline tr.attempt .dlq-badge").evaluate_all(
            "els => els.map(e => e.dataset.value)"
        )
        assert badges[-1] == "dead_lettered" and set(badges[:-1]) == {"retrying"}, badges
    assert not problems, "\n".join(problems)
