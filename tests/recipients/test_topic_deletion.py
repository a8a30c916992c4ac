"""Deleting a topic: gone for the API at once (its key free again, triggers to it refused), its
members deleted by the scheduler in chunks, each its own transaction, resumed after an interrupted
chunk from the last committed one; a fan-out of it stops at its next chunk, and a delete waits for a
chunk in flight rather than deleting members under it."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from core.models import AuditEvent
from queueing import scheduler
from queueing.models import ScheduledJob
from recipients import topics
from recipients.models import Subscriber, Topic, TopicSubscriber
from tests.workflows.test_fanout import define, setup_topic, trigger
from workflows import fanout
from workflows.models import Fanout, WorkflowRun

pytestmark = pytest.mark.django_db


def purge_all(chunk: int) -> list[int]:
    outcomes = []
    while (outcome := topics.purge_once(chunk=chunk)) is not None:
        outcomes.append(outcome)
    return outcomes


def test_a_deleted_topic_is_gone_at_once_and_its_key_is_free_again(api_a, tenant_a):
    define(api_a)
    setup_topic(api_a, members=[f"u{i:04d}" for i in range(2500)])
    old = Topic.objects.get()

    assert api_a.delete("/api/v1/topics/outage").status_code == 204
    assert api_a.get("/api/v1/topics/outage").status_code == 404
    assert api_a.get("/api/v1/topics").json()["results"] == []
    assert api_a.get("/api/v1/topics/outage/subscribers").status_code == 404
    assert api_a.post("/api/v1/topics/outage/subscribers", {"subscribers": ["x"]}, format="json").status_code == 404
    assert api_a.delete("/api/v1/topics/outage").status_code == 404
    refused = trigger(api_a, {"topic": "outage"})
    assert refused.status_code == 400 and "topic" in refused.json()["error"]["details"]
    assert not Fanout.objects.exists()
    # nothing deleted yet: the members go in the background
    assert TopicSubscriber.objects.filter(topic_id=old.pk).count() == 2500
    assert ScheduledJob.objects.get(kind=topics.DELETE_KIND).status == "pending"
    assert AuditEvent.objects.get(action="topic.deleted").details == {"key": "outage", "subscriber_count": 2500}

    made = api_a.put("/api/v1/topics/outage", {"name": "again"}, format="json")
    assert made.status_code == 201 and made.json()["subscriber_count"] == 0
    assert api_a.post("/api/v1/topics/outage/subscribers", {"subscribers": ["u0001", "new"]},
                      format="json").json() == {"added": 2}  # fmt: skip
    assert api_a.get("/api/v1/topics/outage").json()["subscriber_count"] == 2


def test_members_go_in_chunks_each_moving_the_cursor_and_the_last_takes_the_topic(api_a, tenant_a):
    setup_topic(api_a, members=[f"u{i:04d}" for i in range(2500)])
    setup_topic(api_a, key="kept", members=["u0001", "u0002"])
    doomed = Topic.objects.get(key="outage")
    ids = list(TopicSubscriber.objects.filter(topic_id=doomed.pk).order_by("id").values_list("id", flat=True))
    api_a.delete("/api/v1/topics/outage")

    assert topics.purge_once(chunk=1000) == 0
    doomed.refresh_from_db()
    assert (doomed.deleted_through, doomed.subscriber_count) == (ids[999], 1500)
    assert TopicSubscriber.objects.filter(topic_id=doomed.pk).count() == 1500
    assert purge_all(chunk=1000) == [0, 1]  # 1,000 more, then the last 500 with the topic's row
    assert not Topic.objects.filter(pk=doomed.pk).exists()
    assert not TopicSubscriber.objects.filter(topic_id=doomed.pk).exists()
    assert ScheduledJob.objects.get(kind=topics.DELETE_KIND).status == "executed"
    # the other topic and every subscriber stay
    assert TopicSubscriber.objects.count() == 2 == Topic.objects.get(key="kept").subscriber_count
    assert Subscriber.objects.for_tenant(tenant_a).count() == 2500


def test_the_scheduler_runs_the_deletion_through_its_registered_handler(api_a, settings):
    settings.OMNIPOST_TOPIC_DELETE_CHUNK = 300
    setup_topic(api_a, members=[f"u{i}" for i in range(1000)])
    api_a.delete("/api/v1/topics/outage")
    statements = []
    with connection.execute_wrapper(lambda execute, sql, *a: statements.append(sql) or execute(sql, *a)):
        promoted = scheduler.promote_due(100).promoted
    assert promoted == 1 and not TopicSubscriber.objects.exists() and not Topic.objects.exists()
    assert sum("DELETE FROM topic_subscribers" in sql for sql in statements) == 4  # 300, 300, 300, 100


def test_an_interrupted_chunk_leaves_nothing_and_the_next_resumes_after_the_last_committed(api_a, monkeypatch):
    setup_topic(api_a, members=[f"u{i:04d}" for i in range(2500)])
    topic = Topic.objects.get()
    ids = list(TopicSubscriber.objects.order_by("id").values_list("id", flat=True))
    api_a.delete("/api/v1/topics/outage")
    assert topics.purge_once(chunk=1000) == 0

    real = topics._delete_chunk

    def killed(*args: object) -> int:
        real(*args)
        raise RuntimeError("killed between the chunk's DELETE and its commit")

    monkeypatch.setattr(topics, "_delete_chunk", killed)
    with pytest.raises(RuntimeError):
        topics.purge_once(chunk=1000)
    topic.refresh_from_db()
    assert topic.deleted_through == ids[999] and topic.subscriber_count == 1500
    assert TopicSubscriber.objects.count() == 1500
    assert ScheduledJob.objects.get(kind=topics.DELETE_KIND).status == "pending"

    monkeypatch.setattr(topics, "_delete_chunk", real)
    assert purge_all(chunk=1000) == [0, 1]
    assert not TopicSubscriber.objects.exists() and not Topic.objects.exists()


def test_a_fan_out_of_a_deleted_topic_still_makes_every_run_and_the_members_go_after_it(api_a):
    """Exactly one run per member at the trigger, whatever happens to the topic after the 202."""
    define(api_a)
    setup_topic(api_a, members=[f"u{i:04d}" for i in range(2500)])
    body = trigger(api_a, {"topic": "outage"}).json()
    assert fanout.chunk_once(chunk=1000) == 0

    assert api_a.delete("/api/v1/topics/outage").status_code == 204
    assert api_a.get("/api/v1/topics/outage").status_code == 404
    assert purge_all(chunk=1000) == [0]  # waits for the fan-out: postponed, nothing deleted
    deletion = ScheduledJob.objects.get(kind=topics.DELETE_KIND)
    assert deletion.status == "pending" and TopicSubscriber.objects.count() == 2500
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s > now() + interval '1 second'", [deletion.run_at])
        assert cursor.fetchone()[0], "postponed by the database's clock"

    assert fanout.chunk_once(chunk=1000) == 0
    assert fanout.chunk_once(chunk=1000) == 1  # the last chunk: done
    done = Fanout.objects.get()
    assert (done.status, done.created) == ("completed", 2500)
    runs = WorkflowRun.objects.filter(trigger_id=body["trigger_id"])
    assert runs.count() == body["runs"] == 2500 and runs.values("subscriber").distinct().count() == 2500

    ScheduledJob.objects.filter(pk=deletion.pk).update(run_at=deletion.created_at)  # due again now
    assert purge_all(chunk=1000) == [0, 0, 1]
    assert not Topic.objects.exists() and not TopicSubscriber.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_neither_a_delete_nor_a_membership_change_waits_for_a_fan_out_chunk_in_flight(api_a, tenant_a):
    setup_topic(api_a, members=["a", "b"])
    topic = Topic.objects.get()
    holding, release = threading.Event(), threading.Event()
    deleted = threading.Event()

    def chunk_in_flight() -> None:
        try:
            with transaction.atomic():
                assert topics.hold_for_fanout(topic.pk)
                holding.set()
                release.wait(30)
        finally:
            connections.close_all()

    def delete() -> None:
        try:
            topics.delete_topic(tenant_a, "outage", actor="test")
            deleted.set()
        finally:
            connections.close_all()

    chunk = threading.Thread(target=chunk_in_flight)
    chunk.start()
    assert holding.wait(10)
    # a membership change goes on beside the chunk (a lock wait would fail it)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '2s'")
        assert topics.add_members(tenant_a, "outage", ["c"], actor="test") == 1
    deleting = threading.Thread(target=delete)
    deleting.start()
    assert deleted.wait(10)  # a delete does not wait for the chunk either: the fan-out goes on after it
    release.set()
    chunk.join(10)
    deleting.join(10)
    assert topics.hold_for_fanout(topic.pk)  # later chunks still read the members they owe a run
