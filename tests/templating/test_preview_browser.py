"""The template preview in the console, in a real browser: Debian's chromium driven through Playwright
against the live server. A staff member of tenant A opens a template (its versions listed read-only),
previews it on a context whose `<script>` the HTML part escapes, in a locale whose base language has a
variant, then sees a rendering error; tenant B's template's preview is not reachable. The page is
saved to test-artifacts/template-preview.png."""

from __future__ import annotations

import json

import pytest

from templating.models import Template
from tests.dlq.test_console_browser import ARTIFACTS, PASSWORD, chromium_page, staff_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

TEMPLATE = {
    "key": "order", "channel": "email", "subject": "Order {{ number }}", "body": "Hello {{ name }}",
    "html_body": "<h2>Order {{ number }}</h2><p>Hello <b>{{ name }}</b></p>",
    "variants": {"fr": {"subject": "Commande {{ number }}", "body": "Bonjour {{ name }}",
                        "html_body": "<h2>Commande {{ number }}</h2><p>Bonjour <b>{{ name }}</b></p>"}},
}  # fmt: skip


def test_staff_preview_a_template_in_the_browser(live_server, api_a, api_b, tenant_a, tenant_b, monkeypatch):
    assert api_a.post("/api/v1/templates", TEMPLATE, format="json").status_code == 201
    assert (
        api_a.patch("/api/v1/templates/order", {"subject": "Your order {{ number }}"}, format="json").status_code == 200
    )
    assert api_b.post("/api/v1/templates", {**TEMPLATE, "key": "theirs"}, format="json").status_code == 201
    ours = Template.objects.get(key="order")
    theirs = Template.objects.get(key="theirs")
    staff_user("ops-a", "tenant-a", monkeypatch)

    with chromium_page(1280, 1100) as page:
        page.goto(f"{live_server.url}/admin/login/?next=/admin/")
        page.fill("#id_username", "ops-a")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_selector("#user-tools")

        page.goto(f"{live_server.url}/admin/templating/template/{ours.pk}/change/")
        versions = page.locator("#versions-group tbody tr:has(td.field-version)")
        assert versions.count() == 2  # read-only history, newest first
        assert versions.first.locator("td.field-version").inner_text().strip() == "2"
        assert page.locator("#versions-group input[type=text], #versions-group textarea").count() == 0

        page.click("#template-preview-link")
        page.wait_for_selector("#template-preview-form")
        page.fill("#id_context", json.dumps({"name": "<script>alert(1)</script>", "number": 42}))
        page.fill("#id_locale", "fr-CA")
        page.click("#template-preview-submit")
        page.wait_for_selector("#template-preview-result")
        assert page.locator("#preview-version").inner_text() == "2"
        assert page.locator("#preview-locale").inner_text() == "fr"
        assert page.locator("#preview-subject").inner_text() == "Commande 42"
        assert page.locator("#preview-body").inner_text() == "Bonjour <script>alert(1)</script>"
        frame = page.frame_locator("#preview-html")
        assert frame.locator("b").inner_text() == "<script>alert(1)</script>"  # shown as text, never run
        assert frame.locator("script").count() == 0
        assert "&lt;script&gt;" in page.locator("#preview-html").get_attribute("srcdoc")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "template-preview.png"), full_page=True)

        page.fill("#id_context", json.dumps({"name": "Jo", "number": "x"}))
        page.fill("#id_locale", "")
        page.click("#template-preview-submit")
        page.wait_for_selector("#template-preview-result")
        assert page.locator("#preview-subject").inner_text() == "Your order x"
        assert page.locator("#preview-locale").inner_text() == "(the template's own fields)"

        page.fill("#id_context", "[1, 2")
        page.click("#template-preview-submit")
        page.wait_for_selector(".errorlist")
        assert "Not JSON" in page.locator(".errorlist").first.inner_text()

        response = page.goto(f"{live_server.url}/admin/templating/template/{theirs.pk}/preview/")
        assert response.status == 404 and "theirs" not in page.content()
