"""BOLA matrix: tenant B's key against tenant A's objects is 404 on every endpoint and method, and
changes nothing; lists never show A's rows; a missing key is 401 everywhere."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.models import Notification
from providers.models import Provider
from queueing.models import QueueItem, ScheduledJob
from templating.models import Template
from tests.factories import queued
from tests.support.setups import EMAIL, WHSEC, email

pytestmark = pytest.mark.django_db


@pytest.fixture
def a_objects(api_a, setup_a, setup_b) -> dict[str, str]:
    """Tenant A's objects, with names tenant B does not have."""
    Provider.objects.create(tenant=setup_a.tenant, name="a-hook", kind="webhook", channel="webhook",
                            config={"url": "http://127.0.0.1:9/a"}, secrets={"signing_secret": WHSEC})  # fmt: skip
    Template.objects.create(tenant=setup_a.tenant, key="a-tpl", channel="email", body="A {{ x }}")
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    queued_id = api_a.post("/api/v1/notifications", email(), format="json").json()["id"]
    scheduled_id = api_a.post("/api/v1/notifications", email(scheduled_for=later), format="json").json()["id"]
    queued(setup_a.tenant, setup_a.hook, 2)
    return {
        "nid": queued_id,
        "scheduled_nid": scheduled_id,
        "job": str(ScheduledJob.objects.get(notification_id=scheduled_id).pk),
        "provider": "a-hook",
        "template": "a-tpl",
    }


def snapshot() -> dict:
    return {
        "notifications": sorted(Notification.objects.values_list("id", "status", "updated_at")),
        "jobs": sorted(ScheduledJob.objects.values_list("job_id", "status")),
        "items": sorted(QueueItem.objects.values_list("item_id", "lock_token")),
        "providers": sorted((p.pk, p.name, p.is_default, repr(p.config), repr(p.secrets), p.updated_at)
                            for p in Provider.objects.all()),  # fmt: skip
        "templates": sorted(Template.objects.values_list("id", "key", "body", "updated_at")),
    }


OBJECT_CALLS = [
    ("get", "/api/v1/notifications/{nid}", None),
    ("post", "/api/v1/notifications/{nid}/cancel", None),
    ("post", "/api/v1/notifications/{scheduled_nid}/cancel", None),
    ("delete", "/api/v1/scheduled-jobs/{job}", None),
    ("get", "/api/v1/providers/{provider}", None),
    ("patch", "/api/v1/providers/{provider}", {"is_default": True}),
    ("patch", "/api/v1/providers/{provider}", {"config": {"url": "http://127.0.0.1:9/b"}}),
    ("delete", "/api/v1/providers/{provider}", None),
    ("get", "/api/v1/templates/{template}", None),
    ("patch", "/api/v1/templates/{template}", {"body": "B was here"}),
    ("delete", "/api/v1/templates/{template}", None),
]


@pytest.mark.parametrize(("method", "path", "body"), OBJECT_CALLS)
def test_other_tenants_objects_are_404_and_unchanged(api_b, a_objects, method, path, body):
    before = snapshot()
    response = getattr(api_b, method)(path.format(**a_objects), body, format="json")
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "not_found"
    assert snapshot() == before


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/api/v1/notifications", email(provider="a-hook")),
        ("/api/v1/notifications", {"channel": "email", "recipient": EMAIL, "template": "a-tpl"}),
        ("/api/v1/notifications/batch", {"notifications": [email(provider="a-hook")]}),
    ],
)
def test_other_tenants_names_in_bodies_resolve_like_unknown_names(api_b, a_objects, url, body):
    """No oracle: A's provider or template name reads exactly like a name that exists nowhere."""
    before = snapshot()
    theirs = api_b.post(url, body, format="json")
    unknown = api_b.post(url, _renamed(body), format="json")
    assert theirs.status_code == unknown.status_code == 400
    assert theirs.content.decode().replace("a-hook", "?").replace("a-tpl", "?") == unknown.content.decode().replace(
        "zz-none", "?"
    )
    assert snapshot() == before


def _renamed(body: dict) -> dict:
    return json.loads(json.dumps(body).replace("a-hook", "zz-none").replace("a-tpl", "zz-none"))


@pytest.mark.parametrize(
    "path", ["/api/v1/notifications", "/api/v1/scheduled-jobs", "/api/v1/providers", "/api/v1/templates"]
)
def test_lists_show_only_the_callers_rows(api_b, a_objects, setup_b, path):
    results = api_b.get(path).json()["results"]
    text = str(results)
    for value in a_objects.values():
        assert value not in text
    if path == "/api/v1/providers":
        assert {r["name"] for r in results} == {"hook", "mail", "text", "push"}  # B's own


def test_queue_figures_show_only_the_callers_items(api_b, a_objects):
    assert api_b.get("/api/v1/queues").json() == {"results": []}


def test_b_can_reuse_a_name_a_has(api_b, a_objects):
    response = api_b.post("/api/v1/providers", {"name": "a-hook", "channel": "sms", "kind": "console"}, format="json")
    assert response.status_code == 201
    assert Provider.objects.filter(name="a-hook").count() == 2


ALL_CALLS = [
    ("get", "/api/v1/notifications"), ("post", "/api/v1/notifications"), ("post", "/api/v1/notifications/batch"),
    ("get", "/api/v1/notifications/{nid}"), ("post", "/api/v1/notifications/{nid}/cancel"),
    ("get", "/api/v1/scheduled-jobs"), ("delete", "/api/v1/scheduled-jobs/{job}"),
    ("get", "/api/v1/providers"), ("post", "/api/v1/providers"), ("get", "/api/v1/providers/{provider}"),
    ("patch", "/api/v1/providers/{provider}"), ("delete", "/api/v1/providers/{provider}"),
    ("get", "/api/v1/templates"), ("post", "/api/v1/templates"), ("get", "/api/v1/templates/{template}"),
    ("patch", "/api/v1/templates/{template}"), ("delete", "/api/v1/templates/{template}"),
    ("get", "/api/v1/queues"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path"), ALL_CALLS)
def test_every_endpoint_needs_a_key(anonymous, a_objects, method, path):
    before = snapshot()
    response = getattr(anonymous, method)(path.format(**a_objects), {}, format="json")
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"
    assert snapshot() == before
