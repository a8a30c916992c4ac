"""One-click unsubscribe (RFC 8058): emails carry List-Unsubscribe (an https URL with a
signed token, and a mailto: with a bounce domain) and List-Unsubscribe-Post, except for critical
categories; a POST of List-Unsubscribe=One-Click with no cookie opts out of that category on email; a
GET changes nothing; a forged or altered token is 400 and changes nothing; the page's button works in a
real browser."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.test import Client, override_settings

from notifications.models import Notification
from queueing.models import QueueItem
from recipients import suppressions, unsubscribe
from recipients.models import Category, Suppression
from tests import factories
from tests.dlq.test_console_browser import chromium_page
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import SmtpSink

EMAIL = "Jane.Reader@example.org"
PUBLIC = "https://notify.example.com"


def token_for(tenant, category: str = "news") -> str:  # noqa: ANN001
    return unsubscribe.make_token(tenant.pk, EMAIL, category)


@pytest.mark.django_db
def test_tokens_are_authenticated_and_carry_no_address_in_clear(tenant_a):
    token = token_for(tenant_a)
    assert unsubscribe.read_token(token) == (tenant_a.pk, "news", EMAIL.lower())
    assert "jane" not in token.lower() and "example" not in token.lower()
    flipped = token[:40] + ("A" if token[40] != "A" else "B") + token[41:]
    for bad in (flipped, token[:-4], "x" * 80, ""):
        with pytest.raises(unsubscribe.BadToken):
            unsubscribe.read_token(bad)
    with override_settings(SECRET_KEY="another-secret-key-0123456789-abcdefghijklmnop"):
        forged = token_for(tenant_a)
        assert unsubscribe.read_token(forged)  # valid under its own secret…
    with pytest.raises(unsubscribe.BadToken):
        unsubscribe.read_token(forged)  # …not under ours
    with override_settings(SECRET_KEY="rotated-secret-key-0123456789-abcdefghijklmnop",
                           SECRET_KEY_FALLBACKS=[settings.SECRET_KEY]):  # fmt: skip
        assert unsubscribe.read_token(token)[2] == EMAIL.lower()  # a rotated secret's links still work
    with override_settings(SECRET_KEY="rotated-secret-key-0123456789-abcdefghijklmnop", SECRET_KEY_FALLBACKS=[]):
        with pytest.raises(unsubscribe.BadToken):  # revoked: the secret it was made under is gone
            unsubscribe.read_token(token)


@pytest.mark.django_db
@override_settings(OMNIPOST_PUBLIC_URL=PUBLIC, OMNIPOST_BOUNCE_DOMAIN="bounces.example.com")
def test_headers_name_the_url_and_the_mailto(tenant_a):
    headers = dict(unsubscribe.headers(tenant_a.pk, EMAIL, "news"))
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    https, mailto = re.findall(r"<([^>]+)>", headers["List-Unsubscribe"])
    assert https.startswith(f"{PUBLIC}/unsubscribe/") and mailto.startswith("mailto:unsubscribe@bounces.example.com?")
    assert unsubscribe.read_token(https.rsplit("/", 1)[1]) == (tenant_a.pk, "news", EMAIL.lower())
    with override_settings(OMNIPOST_PUBLIC_URL=""):
        assert unsubscribe.headers(tenant_a.pk, EMAIL, "news") == ()


@pytest.mark.django_db
def test_get_changes_nothing_post_opts_out_without_cookies_and_forgeries_are_400(tenant_a):
    token = token_for(tenant_a)
    client = Client(enforce_csrf_checks=True)
    page = client.get(f"/unsubscribe/{token}")
    assert page.status_code == 200 and "j***@example.org" in page.content.decode()
    assert EMAIL.lower() not in page.content.decode().lower() and not page.cookies
    assert not Suppression.objects.exists()
    assert client.post(f"/unsubscribe/{token}", {"other": "x"}).status_code == 400
    assert not Suppression.objects.exists()

    done = client.post(f"/unsubscribe/{token}", "List-Unsubscribe=One-Click",
                       content_type="application/x-www-form-urlencoded")  # fmt: skip
    assert done.status_code == 200 and "unsubscribed" in done.content.decode()
    entry = Suppression.objects.get()
    assert (entry.tenant_id, entry.channel, entry.reason, entry.category) == (tenant_a.pk, "email", "unsubscribed",
                                                                               "news")  # fmt: skip
    assert entry.recipient == EMAIL.lower()
    assert client.post(f"/unsubscribe/{token}", {"List-Unsubscribe": "One-Click"}).status_code == 200
    assert Suppression.objects.count() == 1

    flipped = token[:40] + ("A" if token[40] != "A" else "B") + token[41:]
    for bad in (flipped, "not-a-token"):
        assert client.get(f"/unsubscribe/{bad}").status_code == 400
        assert client.post(f"/unsubscribe/{bad}", {"List-Unsubscribe": "One-Click"}).status_code == 400
    assert Suppression.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_email_carries_both_headers_and_one_click_stops_the_next_of_its_category(
    tenant_a, api_a, subprocess_env, tmp_path
):
    Category.objects.create(tenant=tenant_a, key="news")
    Category.objects.create(tenant=tenant_a, key="security", critical=True)
    env = {**subprocess_env, "OMNIPOST_PUBLIC_URL": PUBLIC, "OMNIPOST_BOUNCE_DOMAIN": "bounces.example.com"}
    with SmtpSink(max_seconds=60) as sink:
        factories.provider(tenant_a, "mail", kind="smtp", channel="email", is_default=True, secrets={},
                           config={"host": "127.0.0.1", "port": sink.port, "from_email": "news@omnipost.test"})

        def send(category: str, subject: str) -> dict:
            body = {"channel": "email", "recipient": EMAIL, "category": category, "subject": subject, "body": "b"}
            response = api_a.post("/api/v1/notifications", body, format="json")
            assert response.status_code == 201, response.content
            return response.json()

        send("news", "Weekly news")
        send("security", "New login")
        drain(env, tmp_path / "run1")
        assert sink.wait_for(2)
        by_subject = {m.message["Subject"]: m.message for m in sink.messages}

    news, security = by_subject["Weekly news"], by_subject["New login"]
    assert news["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    https, mailto = re.findall(r"<([^>]+)>", news["List-Unsubscribe"])
    assert https.startswith(f"{PUBLIC}/unsubscribe/") and mailto.startswith("mailto:unsubscribe@bounces.example.com")
    assert security["List-Unsubscribe"] is None and security["List-Unsubscribe-Post"] is None

    # what a mail client does: POST the URL with the one-click body, no cookie, no CSRF token
    response = Client(enforce_csrf_checks=True).post(
        urlsplit(https).path, "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 200
    assert send("news", "More news")["status"] == "suppressed"
    assert send("general", "Hello")["status"] == "queued"  # another category still goes
    assert [s.category for s in suppressions.matching(tenant_a.pk, EMAIL, "email")] == ["news"]
    assert Notification.objects.filter(status="suppressed").count() == 1


def drain(env: dict, log_dir) -> None:  # noqa: ANN001
    log_dir.mkdir()
    procs = start_dispatchers(1, env, "--batch-size", "10", log_dir=log_dir)
    try:
        assert wait_started(log_dir, 1)
        assert wait_until(lambda: not QueueItem.objects.exists(), 30)
    finally:
        for proc in procs:
            proc.terminate()
        assert wait_exit(procs, 20) == [0]


@pytest.mark.browser
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_the_confirmation_pages_button_unsubscribes_in_a_real_browser(live_server, tenant_a):
    token = token_for(tenant_a)
    with chromium_page(800, 600) as page:
        page.goto(f"{live_server.url}/unsubscribe/{token}")
        assert "j***@example.org" in page.content()
        assert not Suppression.objects.exists()  # the page alone changes nothing
        assert page.context.cookies() == []
        page.click("#unsubscribe")
        page.wait_for_selector("#result")
        assert "no longer get" in page.inner_text("#result")
    entry = Suppression.objects.get()
    assert (entry.category, entry.reason) == ("news", "unsubscribed")
