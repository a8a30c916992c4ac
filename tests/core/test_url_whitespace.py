"""URLs with whitespace or control characters are refused where URLs are checked (core.http.split_url),
before urlsplit drops TAB, CR and LF: an event endpoint or a provider whose URL kept
`\r\nX-Injected: 1` stored and echoed it, and sent it as part of a request line."""

from __future__ import annotations

import pytest

from core.http import split_url
from events.models import EventEndpoint
from providers.models import Provider

pytestmark = pytest.mark.django_db

HOSTILE = [
    "http://127.0.0.1:9/c2\r\nX-Injected:1",
    "http://127.0.0.1:9/c2\nX-Injected:1",
    "http://127.0.0.1:9/a\tb",
    "http://127.0.0.1:9/events\n",
    "http://127.0.0.1:9/events\r\n",
    " http://127.0.0.1:9/events",
    "http://127.0.0.1:9/a b",
    "http://127.0.0.1:9/a\x00b",
    "http://127.0.0.1:9/a\u2028b",
    "http://127.0.0.1:9/a\u00a0b",
    "http://127.0.0.1:9/a\u200bb",
    "http://exa\tmple.com/x",
    "http://127.0.0.1:9/x?q=1\r\n",
]


# The API refuses a NUL anywhere in a JSON body before any field is read (core.api.parsers).
THROUGH_THE_API = [url for url in HOSTILE if "\x00" not in url]


@pytest.mark.parametrize("url", HOSTILE)
def test_split_url_refuses_whitespace_and_control_characters(url):
    with pytest.raises(ValueError, match="whitespace or control characters"):
        split_url(url)


def test_split_url_still_takes_percent_encoded_ones():
    origin, target = split_url("http://127.0.0.1:9/c2%0D%0AX?q=a%20b")
    assert origin.host == "127.0.0.1" and target == "/c2%0D%0AX?q=a%20b"


def details(response) -> dict:  # noqa: ANN001
    assert response.status_code == 400, response.content
    return response.json()["error"]["details"]


@pytest.mark.parametrize("url", THROUGH_THE_API)
def test_event_endpoint_url_is_400_naming_url(api_a, url, settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = True  # the refusal is the characters', not the address's
    body = {"name": "ops", "url": url, "event_types": ["*"]}
    assert "url" in details(api_a.post("/api/v1/event-endpoints", body, format="json"))
    assert not EventEndpoint.objects.exists()
    created = api_a.post("/api/v1/event-endpoints", {**body, "url": "http://127.0.0.1:9/ok"}, format="json")
    assert created.status_code == 201, created.content
    assert "url" in details(api_a.patch("/api/v1/event-endpoints/ops", {"url": url}, format="json"))
    assert EventEndpoint.objects.get().url == "http://127.0.0.1:9/ok"


@pytest.mark.parametrize("url", THROUGH_THE_API)
def test_webhook_provider_url_is_400_naming_url(api_a, url, settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = True
    body = {"name": "hook", "channel": "webhook", "kind": "webhook", "config": {"url": url},
            "secrets": {"signing_secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}  # fmt: skip
    assert "url" in details(api_a.post("/api/v1/providers", body, format="json"))["config"]
    assert not Provider.objects.exists()


@pytest.mark.parametrize(
    ("kind", "channel", "config", "secrets", "field"),
    [
        ("twilio", "sms", {"account_sid": "AC" + "0" * 32, "from_number": "+15551234567",
                           "base_url": "http://127.0.0.1:9/\r\nX-Injected:1"}, {"auth_token": "t" * 32}, "base_url"),
        ("sendgrid", "email", {"from_email": "a@example.com", "base_url": "http://127.0.0.1:9\t/"},
         {"api_key": "SG.key"}, "base_url"),
        ("smtp", "email", {"host": "mail\t.example.com", "port": 25, "from_email": "a@example.com"}, {}, "host"),
    ],
)  # fmt: skip
def test_other_provider_urls_are_400_naming_the_field(api_a, settings, kind, channel, config, secrets, field):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = True
    body = {"name": "p", "channel": channel, "kind": kind, "config": config, "secrets": secrets}
    assert field in details(api_a.post("/api/v1/providers", body, format="json"))["config"]
    assert not Provider.objects.exists()


def test_endpoints_stored_with_such_urls_before_are_disabled_with_the_reason(tenant_a):
    """The migration that came with the check: an endpoint whose url kept CR/LF cannot be sent to."""
    import importlib

    from django.db import connection

    bad = EventEndpoint.objects.create(tenant=tenant_a, name="bad", url="http://127.0.0.1:9/c2\r\nX-Injected:1",
                                       event_types=["*"], secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")  # fmt: skip
    good = EventEndpoint.objects.create(tenant=tenant_a, name="good", url="http://127.0.0.1:9/ok", event_types=["*"],
                                        secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")  # fmt: skip
    sql = importlib.import_module("events.migrations.0005_disable_urls_with_whitespace").DISABLE
    with connection.cursor() as cursor:
        cursor.execute(sql)
    bad.refresh_from_db()
    good.refresh_from_db()
    assert not bad.enabled and "whitespace or control characters" in bad.disabled_reason
    assert good.enabled and good.disabled_reason == ""
