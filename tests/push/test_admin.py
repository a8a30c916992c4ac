"""The console shows a push's per-device results on the notification page (ids and statuses, never a token)."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from notifications.models import NotificationDevice
from tests import factories

pytestmark = pytest.mark.django_db


def test_the_notification_page_lists_each_devices_result(tenant_a):
    provider = factories.provider(tenant_a, "ios", kind="apns", channel="push", config={}, secrets={})
    (notification,) = factories.notifications(tenant_a, provider, 1, recipient="subscriber:jane")
    delivered, dead = uuid.uuid4(), uuid.uuid4()
    NotificationDevice.objects.bulk_create([
        NotificationDevice(tenant=tenant_a, notification=notification, device_id=delivered, kind="apns",
                           provider_id=provider.pk, status="delivered"),
        NotificationDevice(tenant=tenant_a, notification=notification, device_id=dead, kind="apns",
                           provider_id=provider.pk, status="deactivated", error_code="apns_Unregistered"),
    ])  # fmt: skip
    admin = get_user_model().objects.create_superuser("root", "root@example.test", "pw-unused-123")
    client = Client()
    client.force_login(admin)
    page = client.get(f"/admin/notifications/notification/{notification.pk}/change/").content.decode()
    assert str(delivered) in page and str(dead) in page and "apns_Unregistered" in page and "deactivated" in page
