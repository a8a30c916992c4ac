"""Fixtures for receipts: a webhook provider per tenant with delivered notifications, a receiver for
the tenant's event endpoint, and helpers to build receipts and signed Standard Webhooks posts."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook

from core.models import Tenant
from notifications.models import Notification
from providers.models import Provider
from receipts import providers as provider_views
from receipts import throttle
from receipts.inbound import ProviderView, Receipt
from tests import factories
from tests.support.receivers import HttpReceiver

SECRET_A = "whsec_" + base64.b64encode(b"a" * 32).decode()
SECRET_B = "whsec_" + base64.b64encode(b"b" * 32).decode()


@dataclass
class Side:
    tenant: Tenant
    provider: Provider
    notes: list[Notification]

    @property
    def view(self) -> ProviderView:
        view = provider_views.load(self.provider.pk)
        assert view is not None
        return view


def side(tenant: Tenant, secret: str, count: int = 3) -> Side:
    prov = factories.provider(tenant, "hook", secrets={"signing_secret": secret}, is_default=True)
    return Side(tenant, prov, factories.notifications(tenant, prov, count, status="delivered"))


@pytest.fixture(autouse=True)
def fresh_provider_views() -> Iterator[None]:
    provider_views.clear()
    throttle.clear()
    yield
    provider_views.clear()
    throttle.clear()


@pytest.fixture
def event_receiver() -> Iterator[HttpReceiver]:
    """The tenant's own system on loopback for its event endpoint (tests.receipts.event_support): records
    every request and answers 200; the test verifies the signatures with the endpoint's secret."""
    with HttpReceiver(max_seconds=180) as receiver:
        yield receiver


@pytest.fixture
def side_a(tenant_a: Tenant) -> Side:
    return side(tenant_a, SECRET_A)


@pytest.fixture
def side_b(tenant_b: Tenant) -> Side:
    return side(tenant_b, SECRET_B)


def receipt(note: Notification | str, receipt: str | None, *, bounce_type: str | None = None,
            event_id: str | None = None, at: datetime | None = None, type: str | None = None,  # noqa: A002
            details: dict | None = None) -> Receipt:
    return Receipt(
        notification_id=str(getattr(note, "pk", note)), type=type or receipt or "sent",
        occurred_at=at or datetime.now(UTC), receipt=receipt, bounce_type=bounce_type, details=details or {},
        event_id=event_id if event_id is not None else uuid.uuid4().hex,
    )  # fmt: skip


def signed(secret: str, event: dict, *, msg_id: str | None = None, timestamp: datetime | None = None,
           ) -> tuple[bytes, dict[str, str]]:
    """The body and Standard Webhooks headers of an event, signed with the `standardwebhooks` package."""
    body = json.dumps(event)
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    timestamp = timestamp or datetime.now(UTC)
    signature = Webhook(secret).sign(msg_id, timestamp, body)
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(int(timestamp.timestamp())),
               "webhook-signature": signature}  # fmt: skip
    return body.encode(), headers
