"""The SSRF guard: which addresses are refused, at save time (validate) and at send time."""

from __future__ import annotations

import asyncio
import socket
import uuid
from datetime import UTC, datetime

import pytest
from rest_framework.exceptions import ValidationError

from core.http import HttpClient
from providers import ssrf
from providers.kinds import build_provider
from providers.kinds.base import OutboundMessage
from providers.kinds.smtp import SmtpProvider
from providers.kinds.twilio import TwilioProvider
from providers.kinds.webhook import WebhookProvider
from providers.transport import new_client
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver, SmtpSink

SID = "AC" + "0" * 32


@pytest.fixture
def guard_on(settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False


@pytest.fixture
def guard_off(settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = True


def message(channel: str = "webhook", recipient: str = "tok_abcdef123456") -> OutboundMessage:
    return OutboundMessage(str(uuid.uuid4()), "tenant", channel, recipient, "Hi", "Body", {}, datetime.now(UTC), 1)


FORBIDDEN = [
    "127.0.0.1",
    "127.255.255.254",
    "10.1.2.3",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "169.254.0.1",
    "100.64.0.1",  # CGNAT
    "100.127.255.254",
    "0.0.0.0",
    "0.1.2.3",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "192.0.0.8",
    "198.18.0.1",
    "192.0.2.1",
    "::1",
    "::",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "fe80::1%1",
    "ff02::1",
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2001:db8::1",  # documentation
]
ALLOWED = ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "100.128.0.1"]


@pytest.mark.parametrize("address", FORBIDDEN)
def test_non_public_addresses_are_forbidden(address):
    assert ssrf.is_forbidden_ip(address)


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address):
    assert not ssrf.is_forbidden_ip(address)


def test_every_candidate_is_checked_not_only_the_first(guard_on):
    with pytest.raises(ssrf.DestinationForbidden) as excinfo:
        ssrf.check_addresses("mixed.example", ["93.184.216.34", "10.0.0.7"])
    assert excinfo.value.address == "10.0.0.7"
    assert "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS" in str(excinfo.value)


def test_setting_is_read_at_call_time(settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    with pytest.raises(ssrf.DestinationForbidden):
        ssrf.check_addresses("h", ["127.0.0.1"])
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = True
    ssrf.check_addresses("h", ["127.0.0.1"])  # no exception
    with pytest.raises(ssrf.DestinationForbidden):
        ssrf.check_addresses("h", ["127.0.0.1"], allow_private=False)  # explicit override wins


# -- save time -----------------------------------------------------------------------------
WEBHOOK_URLS = [
    "http://127.0.0.1/hook",
    "http://10.0.0.5:8080/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]:8080/hook",
    "http://localhost/hook",
    "http://2130706433/hook",  # 127.0.0.1 as a decimal integer
    "http://127.1/hook",  # shorthand for 127.0.0.1
    "http://[::ffff:127.0.0.1]/hook",
]


@pytest.mark.parametrize("url", WEBHOOK_URLS)
def test_validate_refuses_private_webhook_destination(guard_on, url):
    with pytest.raises(ValidationError) as excinfo:
        WebhookProvider.validate({"url": url}, {"signing_secret": TEST_SIGNING_SECRET})
    [msg] = excinfo.value.detail["config"]["url"]
    assert "non-public" in msg


@pytest.mark.parametrize("url", WEBHOOK_URLS)
def test_validate_allows_private_webhook_destination_when_setting_on(guard_off, url):
    config = WebhookProvider.validate({"url": url}, {"signing_secret": TEST_SIGNING_SECRET})
    assert config["url"] == url


def test_validate_without_destination_check_skips_the_guard(guard_on):
    config = WebhookProvider.validate(
        {"url": "http://10.0.0.5/hook"}, {"signing_secret": TEST_SIGNING_SECRET}, check_destination=False
    )
    assert config["url"] == "http://10.0.0.5/hook"


@pytest.mark.parametrize("host", ["127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "localhost"])
def test_validate_refuses_private_smtp_host(guard_on, host):
    with pytest.raises(ValidationError) as excinfo:
        SmtpProvider.validate({"host": host, "port": 25, "from_email": "a@example.com"}, {})
    assert "non-public" in excinfo.value.detail["config"]["host"][0]


def test_validate_refuses_private_twilio_base_url(guard_on):
    config = {"account_sid": SID, "from_number": "+15005550006", "base_url": "http://169.254.169.254"}
    with pytest.raises(ValidationError) as excinfo:
        TwilioProvider.validate(config, {"auth_token": "t" * 32})
    assert "non-public" in excinfo.value.detail["config"]["base_url"][0]


# -- send time -----------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]"])
def test_webhook_send_to_private_destination_is_refused_before_connecting(guard_on, host):
    with HttpReceiver(secret=TEST_SIGNING_SECRET) as receiver:
        url = f"http://{host}:{receiver.port}/hook"
        provider = build_provider("webhook", {"url": url}, {"signing_secret": TEST_SIGNING_SECRET})

        async def run():
            try:
                return await provider.send(message())
            finally:
                await provider.aclose()

        result = asyncio.run(run())
        assert result.delivered is False
        assert result.error_code == "destination_forbidden"
        assert result.permanent is True
        assert receiver.stats()["connections"] == 0


def test_webhook_send_to_localhost_is_delivered_when_setting_on(guard_off):
    with HttpReceiver(secret=TEST_SIGNING_SECRET) as receiver:
        url = f"http://localhost:{receiver.port}/hook"
        provider = build_provider("webhook", {"url": url}, {"signing_secret": TEST_SIGNING_SECRET})

        async def run():
            try:
                return await provider.send(message())
            finally:
                await provider.aclose()

        assert asyncio.run(run()).delivered
        assert receiver.requests[0].verified


def test_connection_goes_to_the_checked_address_not_a_second_lookup(settings):
    """DNS rebinding: the client connects to the IP it checked, keeping the name for Host."""
    lookups: list[str] = []

    async def resolver(host, port):
        lookups.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))]

    with HttpReceiver(secret=TEST_SIGNING_SECRET) as receiver:
        url = f"http://rebind.example:{receiver.port}/hook"

        async def run(allow):
            client = new_client(resolver=resolver, allow_private=allow)
            provider = WebhookProvider({"url": url}, {"signing_secret": TEST_SIGNING_SECRET}, http_client=client)
            try:
                return await provider.send(message())
            finally:
                await client.aclose()

        refused = asyncio.run(run(False))
        assert refused.error_code == "destination_forbidden"
        assert receiver.stats()["connections"] == 0

        delivered = asyncio.run(run(True))
        assert delivered.delivered
        assert receiver.requests[0].headers["host"] == f"rebind.example:{receiver.port}"
        assert lookups == ["rebind.example", "rebind.example"]  # one lookup per connection, nothing else


def test_smtp_send_to_private_host_is_refused(guard_on):
    with SmtpSink() as sink:
        provider = SmtpProvider(
            {"host": "127.0.0.1", "port": sink.port, "from_email": "alerts@example.com"}, {"password": ""}
        )
        result = asyncio.run(provider.send(message("email", "someone@example.com")))
        assert (result.error_code, result.permanent) == ("destination_forbidden", True)
        assert sink.messages == []


def test_twilio_send_to_private_base_url_is_refused(guard_on):
    with HttpReceiver() as receiver:
        provider = TwilioProvider(
            {"account_sid": SID, "from_number": "+15005550006", "base_url": f"http://127.0.0.1:{receiver.port}"},
            {"auth_token": "secret-token-value"},
        )

        async def run():
            try:
                return await provider.send(message("sms", "+15551234567"))
            finally:
                await provider.aclose()

        result = asyncio.run(run())
        assert (result.error_code, result.permanent) == ("destination_forbidden", True)
        assert receiver.stats()["connections"] == 0


# -- refusals name the rule, never the address (issue 19, item 5) ------------------------------
INTERNAL_HOST = "relay.corp.internal"
INTERNAL_IP = "10.20.30.40"


@pytest.fixture
def internal_dns(monkeypatch):
    """`relay.corp.internal` resolves to a private address, through the resolver every client uses."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if host == INTERNAL_HOST:
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (INTERNAL_IP, port or 0))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    # The dispatcher may run on uvloop, whose resolver is libuv's: answer at the client's resolve step.
    real_resolve = HttpClient._resolve

    async def resolve(self, host, port):  # noqa: ANN001, ANN202
        if host == INTERNAL_HOST:
            return getaddrinfo(host, port)
        return await real_resolve(self, host, port)

    monkeypatch.setattr(HttpClient, "_resolve", resolve)


@pytest.mark.parametrize("address", FORBIDDEN)
def test_the_refusal_names_the_rule_not_the_address(address):
    text = str(ssrf.DestinationForbidden(INTERNAL_HOST, address))
    assert address.split("%")[0] not in text and INTERNAL_HOST not in text
    assert text.startswith("the destination resolves to ") and "non-public" in text


@pytest.mark.parametrize(
    ("address", "rule"),
    [("127.0.0.1", "a loopback address"), ("10.1.2.3", "a private address"), ("::ffff:10.0.0.1", "a private address"),
     ("169.254.169.254", "a link-local address"), ("100.64.0.1", "carrier-grade NAT"), ("0.0.0.0", "unspecified"),
     ("224.0.0.1", "a multicast address"), ("240.0.0.1", "a reserved address"), ("2002:7f00:1::", "loopback")],
)  # fmt: skip
def test_the_rule_is_specific(address, rule):
    assert rule in str(ssrf.DestinationForbidden("h", address))


def test_save_time_refusal_of_a_name_hides_what_it_resolves_to(guard_on, internal_dns):
    with pytest.raises(ValidationError) as excinfo:
        WebhookProvider.validate({"url": f"http://{INTERNAL_HOST}/hook"}, {"signing_secret": TEST_SIGNING_SECRET})
    [msg] = excinfo.value.detail["config"]["url"]
    assert "a private address" in msg and INTERNAL_IP not in msg


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_stored_and_shown_errors_never_carry_the_resolved_address(guard_on, internal_dns, tenant_a, key_a):
    """A dispatcher refuses providers pointed at names resolving to 10.x and 127.x: the attempt's
    error_message, the DLQ's failure_reason and every API answer name the rule, not the address."""
    from dispatch.dispatcher import Dispatcher, DispatcherConfig
    from dlq.models import DeadLetter
    from notifications.models import DeliveryAttempt
    from tests import factories
    from tests.conftest import client_for

    with HttpReceiver(secret=TEST_SIGNING_SECRET) as receiver:
        targets = {INTERNAL_HOST: INTERNAL_IP, "localhost": "127.0.0.1"}
        notes = []
        for index, host in enumerate(targets):
            provider = factories.provider(
                tenant_a, f"p{index}", config={"url": f"http://{host}:{receiver.port}/hook"},
                secrets={"signing_secret": TEST_SIGNING_SECRET},
            )  # fmt: skip
            notes += factories.queued(tenant_a, provider, 1)
        assert Dispatcher(DispatcherConfig(once=True, jitter=False)).run() == 0
        assert receiver.stats()["connections"] == 0

    attempts = list(DeliveryAttempt.objects.filter(notification__in=notes))
    letters = list(DeadLetter.objects.filter(notification__in=notes))
    assert len(attempts) == len(letters) == 2
    assert {a.error_code for a in attempts} == {"destination_forbidden"}
    api = client_for(key_a)
    shown = [a.error_message for a in attempts] + [d.failure_reason for d in letters]
    shown += [api.get(f"/api/v1/notifications/{n.id}").content.decode() for n in notes]
    shown += [api.get("/api/v1/dlq").content.decode()]
    shown += [api.get(f"/api/v1/dlq/{d.pk}").content.decode() for d in letters]
    for text in shown:
        for secret in (*targets.values(), INTERNAL_HOST, "10.20.", "127.0.0."):
            assert secret not in text, text
    assert any("a private address" in t for t in shown) and any("a loopback address" in t for t in shown)
