"""VERP return paths: authenticated tokens naming provider and notification, and the SMTP send using them."""

from __future__ import annotations

import asyncio
import base64
import uuid

import pytest

from providers import verp
from providers.kinds import build_provider
from tests.providers.test_smtp import FROM, message
from tests.support.receivers import SmtpSink

DOMAIN = "bounces.omnipost.example"


@pytest.fixture(autouse=True)
def bounce_domain(settings):
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN
    return settings


def test_round_trip_short_lowercase_and_case_insensitive():
    nid = str(uuid.uuid4())
    for pid in (1, 255, 256, 70_000, 2**63 - 1):
        address = verp.return_path(pid, nid)
        local, _, domain = address.partition("@")
        assert domain == DOMAIN and local.startswith("b+")
        assert local == local.lower() and len(local) <= 64  # RFC 5321 local-part limit
        assert set(local[2:]) <= set("abcdefghijklmnopqrstuvwxyz234567")
        target = verp.read_address(address)
        assert target == verp.VerpTarget(provider_id=pid, notification_id=nid)
        assert verp.read_address(address.upper()) == target  # a relay that upper-cases the local part
        assert verp.read_address(f"<{address}>") == target


def test_a_forged_or_altered_token_names_nothing():
    nid = str(uuid.uuid4())
    token = verp.make_token(7, nid)
    data = base64.b32decode(token.upper() + "=" * (-len(token) % 8))
    # Same tag, another notification or another provider: refused.
    other_nid = uuid.UUID(nid).bytes[:-1] + bytes([uuid.UUID(nid).bytes[-1] ^ 1])
    for body in (other_nid + data[16:], data[:16] + b"\x08" + data[17:]):
        forged = base64.b32encode(body).decode().rstrip("=").lower()
        assert verp.read_token(forged) is None
    assert verp.read_token(token) is not None
    for i in (0, 20, len(token) - 1):  # any character changed, the unused trailing bits included
        for c in "a7":
            if token[i] != c:
                assert verp.read_token(token[:i] + c + token[i + 1 :]) is None
    for junk in ("", "b" * 44, "!" * 50, token + "aaaaaaaa", "é" * 44):
        assert verp.read_token(junk) is None


def test_other_domains_and_other_local_parts_are_not_ours(settings):
    address = verp.return_path(3, str(uuid.uuid4()))
    token = address.split("@")[0][2:]
    assert verp.read_address(f"b+{token}@evil.example") is None
    assert verp.read_address(f"x+{token}@{DOMAIN}") is None
    assert verp.read_address(f"postmaster@{DOMAIN}") is None
    settings.OMNIPOST_BOUNCE_DOMAIN = ""
    assert verp.read_address(address) is None and verp.return_path(3, str(uuid.uuid4())) is None


def test_secret_key_rotation_keeps_old_return_paths_readable(settings):
    nid = str(uuid.uuid4())
    old = verp.make_token(5, nid)
    old_key = settings.SECRET_KEY
    settings.SECRET_KEY = "a-brand-new-secret-key-for-this-test-only-1234567890"
    settings.SECRET_KEY_FALLBACKS = [old_key]
    assert verp.read_token(old) == verp.VerpTarget(5, nid)
    assert verp.make_token(5, nid) != old
    settings.SECRET_KEY_FALLBACKS = []
    assert verp.read_token(old) is None  # a secret dropped from the fallbacks no longer authenticates


def _send(sink: SmtpSink, **options):
    provider = build_provider("smtp", {"from_email": FROM, "host": "127.0.0.1", "port": sink.port}, {}, **options)
    msg = message()
    assert asyncio.run(provider.send(msg)).delivered
    return msg, sink.messages[-1]


def test_smtp_send_uses_the_verp_return_path_and_keeps_the_from_header():
    with SmtpSink() as sink:
        msg, mail = _send(sink, provider_id=42)
    assert verp.read_address(mail.mail_from) == verp.VerpTarget(42, msg.notification_id)
    assert mail.message["From"] == FROM
    assert mail.rcpt_tos == [msg.recipient]


def test_without_a_bounce_domain_or_provider_id_the_envelope_sender_is_from_email(settings):
    with SmtpSink() as sink:
        _, mail = _send(sink)  # built outside the dispatcher: no provider id
        assert mail.mail_from == FROM
        settings.OMNIPOST_BOUNCE_DOMAIN = ""
        _, mail = _send(sink, provider_id=42)
        assert mail.mail_from == FROM


@pytest.mark.django_db
def test_the_dispatcher_builds_smtp_providers_with_their_id(tenant_a):
    from dispatch.providers import instantiate
    from providers.models import Provider

    row = Provider.objects.create(
        tenant=tenant_a, name="mail", channel="email", kind="smtp",
        config={"host": "127.0.0.1", "port": 2525, "from_email": FROM},
    )  # fmt: skip
    assert instantiate(row).provider_id == row.pk
