"""Topics: named groups of a tenant's subscribers, and every statement that writes `topics` and
`topic_subscribers`.

- Membership changes are one statement per call whatever its size (up to 1,000 external ids), after
  the topic's row is locked: adding creates the unknown subscribers (no addresses) and the live
  memberships missing, removing ends the live ones; `subscriber_count` moves by the row counts of
  those very statements, so it is exact without a scan.
- A fan-out (workflows) takes a *boundary* at its trigger, under the same lock: the next value of the
  memberships' id sequence. Members then are those with id <= boundary not removed before it. While a
  fan-out of the topic runs (`active_fanouts` > 0) a removal only marks the membership with the next
  value of that sequence (`removed_seq`), so the fan-out still reaches that member; otherwise, and
  once the last fan-out ends, removed memberships are deleted.
- The fan-out reads members through `members_sql()`: keyset-ordered chunks by id on the index
  (topic_id, id), inside the database. Each chunk first holds the topic's row FOR KEY SHARE
  (`hold_for_fanout`), which membership changes and a delete (FOR NO KEY UPDATE) do not wait for.
- Deleting a topic marks it deleted (gone for the API at once, its key free for a new topic) and
  schedules a job of kind `topic_delete`; the scheduler deletes its memberships in chunks of
  OMNIPOST_TOPIC_DELETE_CHUNK in id order, each chunk one transaction that also moves the topic's
  `deleted_through`, so a killed scheduler resumes after its last committed chunk; the last chunk
  deletes the topic's row and settles the job. While a fan-out of the topic runs, the job waits
  (postponed, FANOUT_WAIT_SECONDS at a time): the fan-out still makes a run for every member at its
  trigger.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now
from rest_framework.exceptions import NotFound

from core.api.errors import Conflict
from core.ids import uuid7
from core.models import AuditEvent, Tenant
from queueing import schedule, scheduler
from recipients.models import Topic, TopicSubscriber
from recipients.services import ensure_subscribers_sql, no_tokens

logger = logging.getLogger(__name__)

MAX_MEMBERS_A_CALL = 1000
MAX_MEMBERS = 10_000_000
_SEQUENCE = "pg_get_serial_sequence('topic_subscribers', 'id')"


def topics_for(tenant: Tenant) -> QuerySet[Topic]:
    """The tenant's topics not deleted (a deleted one is still losing its members in the background)."""
    return Topic.objects.for_tenant(tenant).filter(deleted_at__isnull=True)


def get_topic(tenant: Tenant, key: str) -> Topic:
    topic = topics_for(tenant).filter(key=key).first()
    if topic is None:
        raise NotFound("No topic with this key.")
    return topic


def put_topic(tenant: Tenant, key: str, name: str, *, actor: str) -> tuple[Topic, bool]:
    """Create (True) or rename (False) the topic `key`."""
    with transaction.atomic():
        topic = topics_for(tenant).select_for_update(no_key=True).filter(key=key).first()
        created = topic is None
        if created:
            try:
                with transaction.atomic():
                    topic = Topic.objects.create(tenant=tenant, key=key, name=name)
            except IntegrityError:  # a concurrent PUT created it first: replace its name
                topic = topics_for(tenant).select_for_update(no_key=True).get(key=key)
                created = False
        if not created:
            Topic.objects.filter(pk=topic.pk).update(name=name, updated_at=Now())
            topic.refresh_from_db()
        AuditEvent.record(actor=actor, action="topic.created" if created else "topic.updated", target=topic,
                          details={"key": key})  # fmt: skip
    return topic, created


def delete_topic(tenant: Tenant, key: str, *, actor: str) -> None:
    """The topic is gone for the API at once and its key free again; its memberships (never its
    subscribers) are deleted in the background (`purge_once`) once no fan-out of it runs: a trigger's
    fan-out still makes a run for every member the topic had at the trigger."""
    with transaction.atomic():
        topic = topics_for(tenant).select_for_update(no_key=True).filter(key=key).first()
        if topic is None:
            raise NotFound("No topic with this key.")
        deletion_id = uuid7()
        Topic.objects.filter(pk=topic.pk).update(deleted_at=Now(), deletion_id=deletion_id, updated_at=Now())
        schedule.add_timed_jobs(tenant.pk, DELETE_KIND, [(deletion_id, None, 0.0)])
        AuditEvent.record(actor=actor, action="topic.deleted", target=topic,
                          details={"key": key, "subscriber_count": topic.subscriber_count})  # fmt: skip
    logger.info("%s deleted topic %s; its %d member(s) go in the background", actor, key, topic.subscriber_count)


def _lock(tenant: Tenant, key: str) -> Topic:
    """The live topic's row, FOR NO KEY UPDATE: membership changes and triggers take turns on it, while
    a fan-out's chunk (FOR KEY SHARE) goes on beside them."""
    topic = topics_for(tenant).select_for_update(no_key=True).filter(key=key).first()
    if topic is None:
        raise NotFound("No topic with this key.")
    return topic


# Unknown subscribers (no addresses), then the live memberships missing, then the counter by the
# memberships' own row count: one statement.
def _counted(changes: str, sign: str) -> str:
    """`changes` (CTEs ending in `changed`, one row per membership it changed) and the topic's
    `subscriber_count` moved by their number, in one statement; returns (changed, count now)."""
    return f"""WITH {changes}, counted AS (
    UPDATE topics SET subscriber_count = subscriber_count {sign} (SELECT count(*) FROM changed), updated_at = now()
    WHERE id = %(topic)s
    RETURNING subscriber_count
)
SELECT (SELECT count(*) FROM changed), (SELECT subscriber_count FROM counted)"""  # noqa: S608 - constants


_ADD = _counted("""ensured AS ({ensure}), changed AS (
    INSERT INTO topic_subscribers (tenant_id, topic_id, subscriber, removed_seq, added_at)
    SELECT %(tenant)s, %(topic)s, e.external_id, NULL, now()
    FROM unnest(%(external_ids)s::text[]) AS e(external_id) ORDER BY e.external_id
    ON CONFLICT (topic_id, subscriber) WHERE removed_seq IS NULL DO NOTHING
    RETURNING 1
)""", "+")

# A removal while a fan-out runs keeps the row, marked with the sequence's next value.
_REMOVE_MARK = _counted(f"""changed AS (
    UPDATE topic_subscribers SET removed_seq = nextval({_SEQUENCE})
    WHERE topic_id = %(topic)s AND subscriber = ANY(%(external_ids)s::text[]) AND removed_seq IS NULL
    RETURNING 1
)""", "-")  # noqa: S608 - a constant

_REMOVE_DELETE = _counted("""changed AS (
    DELETE FROM topic_subscribers
    WHERE topic_id = %(topic)s AND subscriber = ANY(%(external_ids)s::text[]) AND removed_seq IS NULL
    RETURNING 1
)""", "-")


def add_members(tenant: Tenant, key: str, external_ids: Sequence[str], *, actor: str) -> int:
    """Add subscribers to the topic (creating the unknown ones); returns how many memberships are new."""
    ids = sorted(set(external_ids))  # one order for every caller: no deadlock on the unique index
    with transaction.atomic():
        topic = _lock(tenant, key)
        if topic.subscriber_count + len(ids) > MAX_MEMBERS:
            raise Conflict(f"A topic holds at most {MAX_MEMBERS:,} subscribers; {key!r} has "
                           f"{topic.subscriber_count:,}.", code="topic_full")  # fmt: skip
        params = {"tenant": tenant.pk, "topic": topic.pk, "external_ids": ids, "ids": [uuid7() for _ in ids],
                  "no_tokens": no_tokens()}  # fmt: skip
        with connections[Topic.objects.db].cursor() as cursor:
            cursor.execute(_ADD.replace("{ensure}", ensure_subscribers_sql()), params)
            added, _ = cursor.fetchone()
    logger.info("%s added %d subscriber(s) to topic %s", actor, added, key)
    return int(added)


def remove_members(tenant: Tenant, key: str, external_ids: Sequence[str], *, actor: str) -> int:
    """End these subscribers' memberships; returns how many there were."""
    ids = sorted(set(external_ids))
    with transaction.atomic():
        topic = _lock(tenant, key)
        sql = _REMOVE_MARK if topic.active_fanouts else _REMOVE_DELETE
        with connections[Topic.objects.db].cursor() as cursor:
            cursor.execute(sql, {"topic": topic.pk, "external_ids": ids})
            removed, _ = cursor.fetchone()
    logger.info("%s removed %d subscriber(s) from topic %s", actor, removed, key)
    return int(removed)


def members_for(topic: Topic) -> QuerySet[TopicSubscriber]:
    """The topic's live memberships (GET topics/{key}/subscribers), oldest first."""
    return TopicSubscriber.objects.for_tenant(topic.tenant_id).filter(topic=topic, removed_seq__isnull=True)


# --- fan-outs (workflows.fanout composes these) ---------------------------------------------------------
_BEGIN = f"""UPDATE topics SET active_fanouts = active_fanouts + 1
WHERE id = %(topic)s
RETURNING nextval({_SEQUENCE}), subscriber_count"""  # noqa: S608 - a constant

_END = """UPDATE topics SET active_fanouts = greatest(active_fanouts - 1, 0) WHERE id = %(topic)s
RETURNING active_fanouts"""
_PURGE = "DELETE FROM topic_subscribers WHERE topic_id = %(topic)s AND removed_seq IS NOT NULL"


def begin_fanout(tenant: Tenant, key: str, actor: str | None) -> tuple[Topic, int, int]:
    """(topic, boundary, members) for a trigger to the topic, in the caller's transaction: the topic's
    row is locked, so no membership change falls between the boundary and the count. `members` leaves
    out `actor` when it is one of them."""
    topic = _lock(tenant, key)
    with connections[Topic.objects.db].cursor() as cursor:
        cursor.execute(_BEGIN, {"topic": topic.pk})
        boundary, count = cursor.fetchone()
    if actor is not None and members_for(topic).filter(subscriber=actor).exists():
        count -= 1
    return topic, int(boundary), int(count)


def end_fanout(topic_id: int, *, using: str = "default") -> None:
    """A fan-out of the topic is done (the caller's transaction): once none runs, removed memberships go."""
    with connections[using].cursor() as cursor:
        cursor.execute(_END, {"topic": topic_id})
        row = cursor.fetchone()
        if row is not None and row[0] == 0:
            cursor.execute(_PURGE, {"topic": topic_id})


_HOLD = "SELECT 1 FROM topics WHERE id = %(topic)s FOR KEY SHARE"


def hold_for_fanout(topic_id: int, *, using: str = "default") -> bool:
    """Whether a fan-out of the topic may read its next chunk (in the chunk's transaction): True while
    the topic's row exists, deleted or not (a deleted topic's memberships wait for its fan-outs, see
    `purge_once`). The row stays held FOR KEY SHARE until the chunk commits."""
    with connections[using].cursor() as cursor:
        cursor.execute(_HOLD, {"topic": topic_id})
        return cursor.fetchone() is not None


def members_sql() -> str:
    """A SELECT of the external ids (`subscriber`) and ids of the topic %(topic)s's members at boundary
    %(boundary)s after id %(after)s, but %(actor)s, in id order, at most %(chunk)s: a fan-out's chunk."""
    return """SELECT m.id, m.subscriber FROM topic_subscribers m
    WHERE m.topic_id = %(topic)s AND m.id > %(after)s AND m.id <= %(boundary)s
      AND (m.removed_seq IS NULL OR m.removed_seq > %(boundary)s)
      AND m.subscriber IS DISTINCT FROM %(actor)s
    ORDER BY m.id
    LIMIT %(chunk)s"""


def member_ahead_sql(subscriber: str) -> str:
    """A boolean SQL expression: whether the external id `subscriber` (an SQL expression) is a live
    member of topic %(topic)s that a fan-out at boundary %(boundary)s has still to reach after id
    %(after)s, but %(actor)s: one probe of the live memberships' unique index. A member removed since
    the boundary (the fan-out still reaches it) is not looked for: no index finds a removed membership
    by its subscriber, and a cancel must not scan a topic of millions while it holds its fan-out."""
    return f"""EXISTS (SELECT 1 FROM topic_subscribers m
    WHERE m.topic_id = %(topic)s AND m.subscriber = {subscriber} AND m.removed_seq IS NULL
      AND m.id > %(after)s AND m.id <= %(boundary)s AND m.subscriber IS DISTINCT FROM %(actor)s)"""  # noqa: S608


# --- deleting a topic's members (the scheduler runs these for due jobs of kind `topic_delete`) -------------
DELETE_KIND = "topic_delete"
FANOUT_WAIT_SECONDS = 2.0  # how often a deletion looks again while a fan-out of its topic runs

# The next chunk of a deleted topic's memberships after `deleted_through`, in id order on the index
# (topic_id, id), deleted by their ids (an array: probes of the primary key; a join of the chunk to the
# table was planned as a scan of all of it), and the topic's cursor and count moved by what it deleted:
# one statement. Starting after the cursor spares each chunk a walk over the index entries its
# predecessors deleted.
_DELETE_CHUNK = """WITH gone AS (
    DELETE FROM topic_subscribers
    WHERE id = ANY(ARRAY(SELECT id FROM topic_subscribers
                         WHERE topic_id = %(topic)s AND id > %(after)s
                         ORDER BY id
                         LIMIT %(chunk)s))
    RETURNING id, removed_seq
), moved AS (
    UPDATE topics SET deleted_through = coalesce((SELECT max(id) FROM gone), deleted_through),
                      subscriber_count = greatest(subscriber_count - (SELECT count(*) FROM gone
                                                                      WHERE removed_seq IS NULL), 0)
    WHERE id = %(topic)s
    RETURNING 1
)
SELECT count(*) FROM gone"""


def delete_chunk_size() -> int:
    return int(settings.OMNIPOST_TOPIC_DELETE_CHUNK)


def _delete_chunk(cursor: object, topic_id: int, after: int, size: int) -> int:
    cursor.execute(_DELETE_CHUNK, {"topic": topic_id, "after": after, "chunk": size})  # type: ignore[attr-defined]
    return int(cursor.fetchone()[0])  # type: ignore[attr-defined]


def purge_once(using: str = "default", *, chunk: int | None = None) -> int | None:
    """One chunk of one deleted topic's memberships, in one transaction: 1 when it was the last (the
    topic's row goes with it), 0 when more remain, None when no deletion is due (or every due one is
    held by a peer)."""
    size = chunk or delete_chunk_size()
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(scheduler.due_jobs_sql(DELETE_KIND), {"n": 1})
        row = cursor.fetchone()
        if row is None:
            return None
        job_id, deletion_id, _ = row
        # FOR UPDATE: a fan-out ending (end_fanout's update of the row, then its purge of marked
        # memberships) commits before this reads active_fanouts, or after this chunk.
        topic = (Topic.objects.using(using).select_for_update().filter(deletion_id=deletion_id)
                 .values_list("pk", "deleted_through", "active_fanouts").first())  # fmt: skip
        if topic is None:  # pragma: no cover - only the last chunk deletes the row, settling its job with it
            schedule.settle_jobs([], [job_id], using=using)
            return 0
        topic_id, after, fanning = topic
        if fanning:  # a fan-out still reads the members it owes a run: they go after it ends
            schedule.postpone_jobs([job_id], FANOUT_WAIT_SECONDS, using=using)
            return 0
        if _delete_chunk(cursor, topic_id, after, size) >= size:
            return 0
        cursor.execute("DELETE FROM topics WHERE id = %s", [topic_id])
        schedule.settle_jobs([job_id], [], using=using)
    logger.info("deleted topic %s: its last memberships are gone", topic_id)
    return 1


def purge(batch_size: int, using: str) -> scheduler.Promotion:
    """Delete chunks of due topic deletions for up to OMNIPOST_TOPIC_DELETE_BUDGET_SECONDS
    (queueing.scheduler.PromotionHandler); `promoted` counts the topics whose deletion finished."""
    budget = float(settings.OMNIPOST_TOPIC_DELETE_BUDGET_SECONDS)
    return scheduler.promote_in_steps(DELETE_KIND, purge_once, budget, using)
