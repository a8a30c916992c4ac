"""Fixtures for the foundation tests: tenant-owned rows in two tenants, staff logins, subprocess helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from core.management.commands.create_staff_user import operators_group
from core.masking import mask_recipient
from core.models import ApiKey, AuditEvent, Tenant, TenantMembership
from dlq.models import DeadLetter
from notifications.models import IdempotencyRecord, Notification
from providers.models import Provider
from workflows.models import Workflow, WorkflowRun

REPO = Path(settings.BASE_DIR)

EMAIL = "jane.doe@example.com"
PHONE = "+15551234567"
WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@dataclass
class TenantRows:
    tenant: Tenant
    provider: Provider
    notification: Notification
    dead_letter: DeadLetter
    api_key: ApiKey
    raw_key: str
    audit: AuditEvent


def make_rows(tenant: Tenant, recipient: str = EMAIL) -> TenantRows:
    provider = Provider.objects.create(
        tenant=tenant,
        name=f"hook-{tenant.name}",
        channel="email",
        kind="webhook",
        config={"url": "https://hooks.example.test/in"},
        secrets={"signing_secret": WHSEC},
    )
    notification = Notification.objects.create(
        id=uuid.uuid4(),
        tenant=tenant,
        channel="email",
        recipient=recipient,
        recipient_masked=mask_recipient("email", recipient),
        provider=provider,
        subject="Hello",
        body="Body",
    )
    dead_letter = DeadLetter.objects.create(
        tenant=tenant,
        notification=notification,
        provider=provider,
        failure_class="permanent",
        failure_reason="410 Gone",
        attempt_count=1,
    )
    key, raw = ApiKey.issue(tenant, name=f"key-{tenant.name}")
    audit = AuditEvent.record(
        actor="user:test", action=f"test.{tenant.name}", target=notification, details={"recipient": recipient}
    )
    return TenantRows(tenant, provider, notification, dead_letter, key, raw, audit)


@pytest.fixture
def rows_a(tenant_a: Tenant) -> TenantRows:
    return make_rows(tenant_a, "alice@example.com")


@pytest.fixture
def rows_b(tenant_b: Tenant) -> TenantRows:
    return make_rows(tenant_b, "bob@example.org")


@pytest.fixture
def secrets_everywhere(rows_a):  # noqa: ANN001, ANN201
    """One row in every encrypted column."""
    record = IdempotencyRecord.objects.create(
        tenant=rows_a.tenant,
        key="idem-1",
        fingerprint="f" * 64,
        response_status=201,
        response_body='{"recipient": "alice@example.com"}',
        expires_at=timezone.now() + timedelta(hours=24),
    )
    sequence = Workflow.objects.create(tenant=rows_a.tenant, kind="sequence", key="welcome")
    enrollment = WorkflowRun.objects.create(  # a sequence's enrollment: a run to a recipient
        tenant=rows_a.tenant,
        workflow=sequence,
        subscriber="",
        trigger_id=uuid.uuid4(),
        status="completed",
        recipient=PHONE,
        recipient_masked="+1******4567",
        starts_at=timezone.now(),
    )
    return rows_a, record, enrollment


def staff_client(username: str, *tenants: Tenant) -> Client:
    user = get_user_model().objects.create_user(username=username, password="not-used-here", is_staff=True)
    user.groups.add(operators_group())
    for tenant in tenants:
        TenantMembership.objects.create(user=user, tenant=tenant)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def staff_a(tenant_a: Tenant) -> Client:
    """A staff login that is a member of tenant A only."""
    return staff_client("staff-a", tenant_a)


@pytest.fixture
def superuser_client(db) -> Client:  # noqa: ANN001
    user = get_user_model().objects.create_superuser(username="root", password="not-used-here")
    client = Client()
    client.force_login(user)
    return client


def run_manage(
    *args: str, env: dict[str, str], stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603
        [sys.executable, str(REPO / "manage.py"), *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def clean_env(**overrides: str) -> dict[str, str]:
    """The environment minus every OmniPost/Django variable, plus `overrides`."""
    drop = ("OMNIPOST_", "DJANGO_", "DEBUG", "SECRET_KEY", "DATABASE_URL", "ALLOWED_HOSTS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(overrides)
    return env
