"""Topics, their members and fan-outs in the console: pages render for the tenant's staff only, a
topic's member count is its stored counter, members never show an address, every list is a fixed
number of queries whatever its rows, and cancelling a fan-out (audited) stops its further chunks."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from core.management.commands.create_staff_user import operators_group
from core.models import AuditEvent, TenantMembership
from queueing.models import ScheduledJob
from recipients.models import Subscriber, Topic, TopicSubscriber
from tests.workflows.test_fanout import define, setup_topic, trigger
from workflows import fanout
from workflows.models import Fanout, WorkflowRun

pytestmark = pytest.mark.django_db

TOPICS = "/admin/recipients/topic/"
MEMBERS = "/admin/recipients/topicsubscriber/"
FANOUTS = "/admin/workflows/fanout/"


def staff(name: str, tenant) -> Client:  # noqa: ANN001
    user = get_user_model().objects.create_user(name, f"{name}@example.test", "pw-unused-123", is_staff=True)
    user.groups.add(operators_group())
    TenantMembership.objects.create(user=user, tenant=tenant)
    client = Client()
    client.force_login(user)
    return client


def fill(topic: Topic, count: int, start: int = 0) -> None:
    """Memberships straight in SQL (the counter moved with them), as a bench fills a big topic."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO topic_subscribers (tenant_id, topic_id, subscriber, added_at) "
            "SELECT %s, %s, 'm' || g, now() FROM generate_series(%s, %s) g",
            [topic.tenant_id, topic.pk, start, start + count - 1],
        )
    Topic.objects.filter(pk=topic.pk).update(subscriber_count=start + count)


def queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_topics_show_their_counter_and_members_to_their_tenants_staff_only(api_a, tenant_a, tenant_b):
    Subscriber.objects.create(tenant=tenant_a, external_id="ann", email="ann.secret@example.com",
                              phone="+447700900123")  # fmt: skip
    setup_topic(api_a, key="outage", members=["ann", *(f"u{i}" for i in range(1499))])
    topic = Topic.objects.get()
    ann, bob = staff("ann", tenant_a), staff("bob", tenant_b)

    page = ann.get(TOPICS).content.decode()
    assert "outage" in page and "1,500" in page and "live" in page
    assert f"{MEMBERS}?topic__id__exact={topic.pk}" in page
    assert "outage" not in bob.get(TOPICS).content.decode()
    assert ann.get(f"{TOPICS}{topic.pk}/change/").status_code == 200
    assert bob.get(f"{TOPICS}{topic.pk}/change/").status_code == 302  # not theirs: back to the index

    members = ann.get(f"{MEMBERS}?topic__id__exact={topic.pk}&q=ann").content.decode()
    assert ">ann<" in members
    assert "ann.secret" not in members and "900123" not in members
    detail = ann.get(f"{MEMBERS}{TopicSubscriber.objects.get(subscriber='ann').pk}/change/").content.decode()
    assert "ann.secret" not in detail and "900123" not in detail
    # (a member's cell, not two letters a CSRF token may hold)
    assert ">u1<" not in bob.get(f"{MEMBERS}?topic__id__exact={topic.pk}").content.decode()
    assert ">u1<" in ann.get(f"{MEMBERS}?topic__id__exact={topic.pk}&q=u1").content.decode()

    api_a.delete("/api/v1/topics/outage")
    assert "deleting" in ann.get(TOPICS).content.decode()


def test_each_list_is_a_fixed_number_of_queries_whatever_its_rows(api_a, tenant_a):
    define(api_a)
    ann = staff("ann", tenant_a)
    setup_topic(api_a, key="t0")
    topic = Topic.objects.get()
    fill(topic, 10_500)  # past the paginator's exact count (the rest is the planner's estimate)
    trigger(api_a, {"topic": "t0"})
    few = [queries(ann, TOPICS), queries(ann, f"{MEMBERS}?topic__id__exact={topic.pk}"), queries(ann, FANOUTS)]

    for i in range(1, 12):
        setup_topic(api_a, key=f"t{i}")
        trigger(api_a, {"topic": f"t{i}"})
    fill(topic, 20_000, start=10_500)
    many = [queries(ann, TOPICS), queries(ann, f"{MEMBERS}?topic__id__exact={topic.pk}"), queries(ann, FANOUTS)]
    assert many == few
    page = ann.get(TOPICS).content.decode()
    assert "30,500" in page  # the counter, not a count


def test_fan_outs_show_progress_and_staff_cancel_them_before_the_next_chunk(api_a, tenant_a, tenant_b):
    define(api_a)
    setup_topic(api_a, members=[f"u{i:04d}" for i in range(2500)])
    body = trigger(api_a, {"topic": "outage", "data": {"eta": "1h"}}).json()
    assert fanout.chunk_once(chunk=1000) == 0
    ann = staff("ann", tenant_a)

    page = ann.get(FANOUTS).content.decode()
    assert "<progress" in page and "1,000 / 2,500 runs" in page and "outage" in page
    assert "outage" not in staff("bob", tenant_b).get(FANOUTS).content.decode()
    assert ann.get(f"{FANOUTS}{body['trigger_id']}/change/").status_code == 200

    # another tenant's staff cannot cancel it
    staff("bob2", tenant_b).post(FANOUTS, {"action": "cancel_selected", "_selected_action": [body["trigger_id"]]})
    assert Fanout.objects.get().status == "running"

    response = ann.post(FANOUTS, {"action": "cancel_selected", "_selected_action": [body["trigger_id"]]},
                        follow=True)  # fmt: skip
    assert "Cancelled 1 fan-out" in response.content.decode()
    stopped = Fanout.objects.get()
    assert (stopped.status, stopped.created) == ("cancelled", 1000)
    assert ScheduledJob.objects.get(kind=fanout.JOB_KIND).status == "cancelled"
    assert Topic.objects.get().active_fanouts == 0
    event = AuditEvent.objects.get(action="fanout.cancelled")
    assert event.actor == "user:ann" and event.details == {"topic": "outage", "created": 1000, "total": 2500}
    assert fanout.chunk_once(chunk=1000) is None
    assert WorkflowRun.objects.count() == 1000

    again = ann.post(FANOUTS, {"action": "cancel_selected", "_selected_action": [body["trigger_id"]]}, follow=True)
    assert "1 not cancelled: only running fan-outs can be" in again.content.decode()
