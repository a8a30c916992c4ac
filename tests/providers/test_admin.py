"""The provider console shows the adaptive rate the dispatchers use, never a secret."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from queueing.models import RateBucket
from tests import factories

pytestmark = pytest.mark.django_db


def test_provider_list_shows_the_effective_rate_and_masks_secrets(tenant_a):
    prov = factories.provider(tenant_a, "limited", rate_per_second=100, burst=10,
                              secrets={"signing_secret": "whsec_c2VjcmV0LXNpZ25pbmcta2V5LTEyMzQ1Njc4OTA="})
    RateBucket.objects.create(key=f"provider:{prov.pk}", rate=100, effective_rate=35.5, burst=10, tokens=1)
    admin = get_user_model().objects.create_superuser("root", "root@example.test", "pw-unused-123")
    client = Client()
    client.force_login(admin)
    page = client.get("/admin/providers/provider/").content.decode()
    assert "35.5" in page
    assert "c2VjcmV0LXNpZ25pbmcta2V5" not in page
    detail = client.get(f"/admin/providers/provider/{prov.pk}/change/").content.decode()
    assert "c2VjcmV0LXNpZ25pbmcta2V5" not in detail


def test_api_reads_the_same_effective_rate(tenant_a, api_a):
    prov = factories.provider(tenant_a, "limited", rate_per_second=100, burst=10)
    RateBucket.objects.create(key=f"provider:{prov.pk}", rate=100, effective_rate=42.0, burst=10, tokens=1)
    body = api_a.get("/api/v1/providers/limited").json()
    assert body["effective_rate_per_second"] == 42.0
