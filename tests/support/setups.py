"""A tenant's providers and templates for the API and service tests of every room (`setup_a`,
`setup_b`, `make_setup`), the addresses they send to, and fresh API throttle buckets for each test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from core.api.throttling import TenantRateThrottle
from core.models import Tenant
from providers.models import Provider
from templating.models import Template

WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
EMAIL = "jane.doe@example.com"
PHONE = "+15551234567"
TOKEN = "tok_1234567890abcdef9f2c"


@dataclass
class Setup:
    tenant: Tenant
    hook: Provider  # webhook kind, default for the webhook channel
    mail: Provider  # console kind, default for email
    text: Provider  # console kind, default for sms
    push: Provider  # webhook kind, default for push
    welcome: Template  # email template


def make_setup(tenant: Tenant) -> Setup:
    def provider(name: str, kind: str, channel: str, **extra: object) -> Provider:
        config = {"url": "http://127.0.0.1:9/hook", "timeout_seconds": 5.0} if kind == "webhook" else {}
        secrets = {"signing_secret": WHSEC} if kind == "webhook" else {}
        return Provider.objects.create(
            tenant=tenant, name=name, kind=kind, channel=channel, config=config, secrets=secrets, is_default=True,
            **extra,
        )

    return Setup(
        tenant=tenant,
        hook=provider("hook", "webhook", "webhook"),
        mail=provider("mail", "console", "email"),
        text=provider("text", "console", "sms"),
        push=provider("push", "webhook", "push"),
        welcome=Template.objects.create(
            tenant=tenant, key="welcome", channel="email", subject="Hi {{ name }}", body="Welcome, {{ name }}!"
        ),
    )


@pytest.fixture
def setup_a(tenant_a: Tenant) -> Setup:
    return make_setup(tenant_a)


@pytest.fixture
def setup_b(tenant_b: Tenant) -> Setup:
    return make_setup(tenant_b)


@pytest.fixture(autouse=True)
def fresh_throttle_buckets() -> Iterator[None]:
    TenantRateThrottle._local.clear()
    yield
    TenantRateThrottle._local.clear()


def email(**extra: object) -> dict:
    return {"channel": "email", "recipient": EMAIL, "subject": "Hello", "body": "Body", **extra}
