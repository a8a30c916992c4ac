"""Topics through the API: create/rename/delete, membership by the thousand with counts of what
changed, the counter kept without a scan, listing by cursor, field-level 400s, tenant isolation."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from recipients.models import Subscriber, Topic, TopicSubscriber

pytestmark = pytest.mark.django_db


def members(api, key, body):  # noqa: ANN001, ANN201
    return api.post(f"/api/v1/topics/{key}/subscribers", {"subscribers": body}, format="json")


def remove(api, key, body):  # noqa: ANN001, ANN201
    return api.delete(f"/api/v1/topics/{key}/subscribers", {"subscribers": body}, format="json")


def test_a_topic_is_created_renamed_listed_and_deleted(api_a):
    made = api_a.put("/api/v1/topics/outage", {"name": "Outage"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["key"] == "outage" and made.json()["subscriber_count"] == 0
    again = api_a.put("/api/v1/topics/outage", {"name": "Outages"}, format="json")
    assert again.status_code == 200 and again.json()["name"] == "Outages"
    api_a.put("/api/v1/topics/news", {}, format="json")
    listed = api_a.get("/api/v1/topics?limit=1").json()
    assert [t["key"] for t in listed["results"]] == ["news"] and listed["next"]
    second = api_a.get(listed["next"]).json()
    assert [t["key"] for t in second["results"]] == ["outage"]
    assert api_a.delete("/api/v1/topics/outage").status_code == 204
    assert api_a.get("/api/v1/topics/outage").status_code == 404
    assert api_a.delete("/api/v1/topics/outage").status_code == 404


def test_membership_counts_what_changed_and_creates_unknown_subscribers(api_a, tenant_a):
    Subscriber.objects.create(tenant=tenant_a, external_id="known", email="k@example.com")
    api_a.put("/api/v1/topics/outage", {"name": "Outage"}, format="json")
    first = members(api_a, "outage", ["known", "u1", "u2", "u2"])
    assert first.status_code == 200 and first.json() == {"added": 3}
    assert members(api_a, "outage", ["u1", "u3"]).json() == {"added": 1}
    assert Subscriber.objects.for_tenant(tenant_a).filter(external_id__in=["u1", "u2", "u3"]).count() == 3
    assert Subscriber.objects.for_tenant(tenant_a).get(external_id="u3").email is None
    assert api_a.get("/api/v1/topics/outage").json()["subscriber_count"] == 4
    assert remove(api_a, "outage", ["u1", "nobody", "u1"]).json() == {"removed": 1}
    assert remove(api_a, "outage", ["u1"]).json() == {"removed": 0}
    assert api_a.get("/api/v1/topics/outage").json()["subscriber_count"] == 3
    assert members(api_a, "outage", ["u1"]).json() == {"added": 1}
    assert Topic.objects.get().subscriber_count == TopicSubscriber.objects.filter(removed_seq__isnull=True).count()


def test_a_thousand_subscribers_are_a_fixed_number_of_statements(api_a):
    api_a.put("/api/v1/topics/big", {}, format="json")
    with CaptureQueriesContext(connection) as small:
        assert members(api_a, "big", ["a"]).json() == {"added": 1}
    with CaptureQueriesContext(connection) as large:
        assert members(api_a, "big", [f"s{i}" for i in range(1000)]).json() == {"added": 1000}
    assert len(large.captured_queries) == len(small.captured_queries)
    assert api_a.get("/api/v1/topics/big").json()["subscriber_count"] == 1001
    with CaptureQueriesContext(connection) as read:
        api_a.get("/api/v1/topics/big")
    assert not any("count(" in q["sql"].lower() for q in read.captured_queries)


def test_members_are_listed_by_cursor_in_the_order_they_joined(api_a):
    api_a.put("/api/v1/topics/t", {}, format="json")
    members(api_a, "t", ["c", "a", "b"])  # one call: joined in sorted order
    members(api_a, "t", ["z"])
    page = api_a.get("/api/v1/topics/t/subscribers?limit=2").json()
    assert [m["subscriber"] for m in page["results"]] == ["a", "b"]
    rest = api_a.get(page["next"]).json()
    assert [m["subscriber"] for m in rest["results"]] == ["c", "z"] and rest["next"] is None
    assert api_a.get("/api/v1/topics/t/subscribers?limit=0").status_code == 400
    assert api_a.get("/api/v1/topics/t/subscribers?color=red").status_code == 400


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"subscribers": []}, "subscribers"),
        ({"subscribers": [f"s{i}" for i in range(1001)]}, "subscribers"),
        ({"subscribers": ["ok", "a/b"]}, "subscribers"),
        ({"subscribers": ["ok", 7]}, "subscribers"),
        ({"subscribers": "abc"}, "subscribers"),
        ({}, "subscribers"),
        ({"subscribers": ["a"], "extra": 1}, "extra"),
    ],
)
def test_bad_membership_bodies_are_400_naming_the_field(api_a, body, field):
    api_a.put("/api/v1/topics/t", {}, format="json")
    response = api_a.post("/api/v1/topics/t/subscribers", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"]
    assert not TopicSubscriber.objects.exists()


def test_bad_topic_bodies_and_keys_are_400(api_a):
    assert "name" in api_a.put("/api/v1/topics/t", {"name": 5}, format="json").json()["error"]["details"]
    assert "name" in api_a.put("/api/v1/topics/t", {"name": "x" * 201}, format="json").json()["error"]["details"]
    assert "color" in api_a.put("/api/v1/topics/t", {"color": "red"}, format="json").json()["error"]["details"]
    assert "key" in api_a.put("/api/v1/topics/bad key!", {}, format="json").json()["error"]["details"]
    assert not Topic.objects.exists()
    assert members(api_a, "missing", ["a"]).status_code == 404


def test_another_tenants_topic_is_404_and_keys_are_per_tenant(api_a, api_b, tenant_b):
    api_a.put("/api/v1/topics/outage", {}, format="json")
    members(api_a, "outage", ["a1"])
    assert api_b.get("/api/v1/topics/outage").status_code == 404
    assert api_b.get("/api/v1/topics/outage/subscribers").status_code == 404
    assert members(api_b, "outage", ["b1"]).status_code == 404
    assert remove(api_b, "outage", ["a1"]).status_code == 404
    assert api_b.delete("/api/v1/topics/outage").status_code == 404
    assert api_b.get("/api/v1/topics").json()["results"] == []
    assert api_b.put("/api/v1/topics/outage", {}, format="json").status_code == 201
    assert api_b.get("/api/v1/topics/outage").json()["subscriber_count"] == 0
    assert not Subscriber.objects.for_tenant(tenant_b).exists()
    assert api_a.get("/api/v1/topics/outage").json()["subscriber_count"] == 1


def test_the_schema_describes_topics(api_a):
    schema = api_a.get("/api/schema/?format=json").json()
    paths = schema["paths"]
    assert {"get", "put", "delete"} <= set(paths["/api/v1/topics/{key}"])
    assert {"get", "post", "delete"} <= set(paths["/api/v1/topics/{key}/subscribers"])
    topic = schema["components"]["schemas"]["Topic"]["properties"]
    assert {"key", "name", "subscriber_count"} <= set(topic)
    trigger = schema["components"]["schemas"]["TriggerRequest"]["properties"]
    assert "topic" in trigger
