"""Every statement that writes the workflows' throttle and digest tables: single conditional
statements whose row counts decide who goes on, under any number of schedulers.

- Throttle: one counter row per (workflow, step, subscriber, key). A run passes when one upsert
  either opens a new window (none yet, or the last one is over) or adds one to a window still under
  its limit; the (limit+1)-th run of a window matches nothing and ends `throttled`.
- Digest: one `open` window at most per (workflow, step, subscriber, key) (a partial unique index).
  A run reaching the step joins the open window if its trigger came before the window closes (one
  UPDATE adding its count and, among the 100 oldest triggers, its data); else it opens a window itself (one
  INSERT … ON CONFLICT DO NOTHING, at its trigger's time) and leads it: it waits until the window's
  end, then closes it (one UPDATE, status `closed`: no join after that) and goes on with its count and
  items. Row locks order a join and the close, so every joined trigger is counted once, in exactly one
  window, and each window has exactly one run that goes on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections

from core import hot_sql
from core.ids import uuid7
from core.retention import RetainedTable
from notifications.statements import json_text
from queueing import schedule
from workflows.models import FINISHED, WorkflowRun, initial_states
from workflows.steps import MAX_WINDOW_SECONDS, key_value

MAX_ITEMS = 100

_FINISHED = ", ".join(f"'{status}'" for status in FINISHED)
# What `prune` deletes past retention (core.retention), in this order: a digest window is kept while
# the run that leads it has not finished; a throttle's counter until its window cannot still be open.
RETAINED = (
    # (a sequence's enrollment finishes at its start; its last step's time may lie far ahead)
    RetainedTable(
        "workflow_runs",
        f"updated_at < %(cutoff)s AND status IN ({_FINISHED})"
        " AND coalesce((steps -> -1 ->> 'at')::timestamptz, updated_at) < %(cutoff)s",
        "finished workflow run(s)",
    ),
    RetainedTable(
        "workflow_digests",
        "status = 'closed' AND closes_at < %(cutoff)s AND NOT EXISTS (SELECT 1 FROM workflow_runs r"
        " WHERE r.id = workflow_digests.leader_id AND r.status IN ('running', 'waiting'))",
        "closed digest window(s)",
    ),
    RetainedTable(
        "workflow_throttles",
        f"window_start < LEAST(%(cutoff)s, now() - interval '{MAX_WINDOW_SECONDS} seconds')",
        "throttle window(s)",
    ),
)

# A trigger's runs, each waiting on a job due now, in one statement whatever their count: from `s`
# (columns id, subscriber, wake_id), a list the caller names or a bulk send's rows (with each run's
# data). A run that exists already for the trigger and subscriber adds nothing.
_START_RUNS = """WITH s AS ({source}), runs AS (
    INSERT INTO workflow_runs (id, tenant_id, workflow_id, subscriber, trigger_id, status, cancellation_key, actor,
                               data, definition, category, step_index, steps, digest, wake_id, test)
    SELECT s.id, %(tenant)s, %(workflow)s, s.subscriber, %(trigger)s, 'running', %(cancellation_key)s, %(actor)s,
           {data}, %(definition)s::jsonb, %(category)s, 0, %(steps)s::jsonb, NULL, s.wake_id, %(test)s
    FROM s
    ON CONFLICT (trigger_id, subscriber) DO NOTHING
    RETURNING wake_id AS opaque_id, NULL::timestamptz AS at, 0::float8 AS secs
), {jobs}"""

_LISTED = """SELECT * FROM unnest(%(ids)s::uuid[], %(subscribers)s::text[], %(wakes)s::uuid[])
    AS s(id, subscriber, wake_id)"""

# Version 7 UUIDs made by the database for a statement's rows (core.ids.uuid7's layout: 48 bits of
# Unix milliseconds, the version, random bits), the statement's millisecond for all of them (read once:
# per row it would cost more than the rest of the row), so the runs of successive chunks sit in
# creation order in their primary key's index.
_UUID7_PREFIX = """overlay(substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::int8) FROM 3)
    PLACING '\\x70'::bytea FROM 7 FOR 0)"""
_UUID7 = "encode(overlay(uuid_send(gen_random_uuid()) PLACING (SELECT prefix FROM v7) FROM 1 FOR 7), 'hex')::uuid"


def start_runs(
    tenant_id: Any, workflow: Any, trigger_id: Any, subscribers: list[str], *, data: dict[str, Any],  # noqa: ANN401
    cancellation_key: str | None, actor: str | None, job_kind: str, test: bool = False,
) -> None:  # fmt: skip
    """One `running` run per subscriber (its first step due now) and its job (the caller's transaction)."""
    params = {
        "ids": [uuid7() for _ in subscribers], "subscribers": subscribers,
        "wakes": [uuid.uuid4() for _ in subscribers], "tenant": tenant_id, "workflow": workflow.pk,
        "trigger": trigger_id, "cancellation_key": cancellation_key, "actor": actor, "data": json.dumps(data),
        "definition": json.dumps(workflow.steps), "category": workflow.category,
        "steps": json.dumps(initial_states(workflow.steps)), "test": test,
    }  # fmt: skip
    sql = _START_RUNS.format(source=_LISTED, data="%(data)s::jsonb",
                             jobs=schedule.timed_jobs_sql("runs s", job_kind))  # fmt: skip
    with connections[WorkflowRun.objects.db].cursor() as cursor:
        cursor.execute(sql, params)


# Rows of a bulk send, each its own subscriber and data.
_LISTED_WITH_DATA = """SELECT * FROM unnest(%(ids)s::uuid[], %(subscribers)s::text[], %(wakes)s::uuid[],
    %(datas)s::text[]) AS s(id, subscriber, wake_id, data)"""


def start_rows(
    tenant_id: Any, workflow: Any, trigger_id: Any, rows: list[tuple[str, dict[str, Any]]], *,  # noqa: ANN401
    actor: str | None, job_kind: str, test: bool = False,
) -> None:  # fmt: skip
    """One `running` run per `(subscriber, data)` (its first step due now) and its job, like start_runs
    but with each run's own data (the caller's transaction); a subscriber that has a run of
    `trigger_id` already adds none."""
    params = {
        "ids": [uuid7() for _ in rows], "subscribers": [r[0] for r in rows], "wakes": [uuid.uuid4() for _ in rows],
        "datas": [json.dumps(r[1]) for r in rows], "tenant": tenant_id, "workflow": workflow.pk,
        "trigger": trigger_id, "cancellation_key": None, "actor": actor, "definition": json.dumps(workflow.steps),
        "category": workflow.category, "steps": json.dumps(initial_states(workflow.steps)), "test": test,
    }  # fmt: skip
    sql = _START_RUNS.format(source=_LISTED_WITH_DATA, data="s.data::jsonb",
                             jobs=schedule.timed_jobs_sql("runs s", job_kind))  # fmt: skip
    with connections[WorkflowRun.objects.db].cursor() as cursor:
        cursor.execute(sql, params)


# A fan-out's chunk: the next members of the topic (recipients.topics.members_sql) become runs, narrow
# (data, definition and steps NULL: the fan-out's), each %(per_job)s of them (in member order) waiting
# on one job due now, and the fan-out's row moves past them, in one statement (one transaction with
# its lock). A member a cancel named ahead of the fan-out (workflow_fanout_cancels, cancel_ahead) gets
# its run `cancelled`, waiting on nothing (steps NULL: every step pending, none taken); an engine
# batch of such runs only gets no job.
_CHUNK = f"""WITH v7 AS (
    SELECT {_UUID7_PREFIX} AS prefix
), s AS (
    SELECT {_UUID7} AS id, m.subscriber, m.id AS member_id,
           (row_number() OVER (ORDER BY m.id) - 1) / %(per_job)s AS part,
           EXISTS (SELECT 1 FROM workflow_fanout_cancels c
                   WHERE c.fanout_id = %(trigger)s AND c.subscriber = m.subscriber) AS cancelled
    FROM ({{members}}) m
), wakes AS (
    SELECT part, gen_random_uuid() AS id FROM generate_series(0, (SELECT max(part) FROM s)) AS part
), runs AS (
    INSERT INTO workflow_runs (id, tenant_id, workflow_id, subscriber, trigger_id, status, cancellation_key, actor,
                               data, definition, category, step_index, steps, digest, wake_id, test)
    SELECT s.id, %(tenant)s, %(workflow)s, s.subscriber, %(trigger)s,
           CASE WHEN s.cancelled THEN 'cancelled' ELSE 'running' END, %(cancellation_key)s, %(actor)s,
           NULL, NULL, %(category)s, 0, NULL, NULL, CASE WHEN s.cancelled THEN NULL ELSE w.id END, %(test)s
    FROM s JOIN wakes w USING (part)
    ON CONFLICT (trigger_id, subscriber) DO NOTHING
    RETURNING wake_id
), moved AS (
    UPDATE workflow_fanouts SET cursor = coalesce((SELECT max(member_id) FROM s), cursor),
        created = created + (SELECT count(*) FROM runs), chunks = chunks + 1,
        last_read = (SELECT count(*) FROM s)
    WHERE id = %(trigger)s
), {{jobs}}"""  # noqa: S608 - constants
_CHUNK_JOBS = """(SELECT DISTINCT wake_id AS opaque_id, NULL::timestamptz AS at, 0::float8 AS secs FROM runs
    WHERE wake_id IS NOT NULL) s"""


def fan_out_chunk(
    fanout: Any, members_sql: str, chunk: int, job_kind: str, per_job: int, *, using: str = "default",  # noqa: ANN401
) -> int:  # fmt: skip
    """Runs for the next `chunk` members of the fan-out's topic after its cursor, and a job for each
    `per_job` of them (the caller's transaction, the fan-out's row locked); returns how many members
    the chunk read (fewer than `chunk`: the fan-out is done)."""
    params = {
        "tenant": fanout.tenant_id, "workflow": fanout.workflow_id, "trigger": fanout.pk,
        "cancellation_key": fanout.cancellation_key, "actor": fanout.actor, "category": fanout.category,
        "topic": fanout.topic_id, "after": fanout.cursor, "boundary": fanout.boundary, "chunk": chunk,
        "test": fanout.test, "per_job": per_job,
    }  # fmt: skip
    sql = _CHUNK.replace("{members}", members_sql).replace("{jobs}", schedule.timed_jobs_sql(_CHUNK_JOBS, job_kind))
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        cursor.execute("SELECT cursor, created, last_read FROM workflow_fanouts WHERE id = %s", [fanout.pk])
        fanout.cursor, fanout.created, read = cursor.fetchone()
    return int(read)


_THROTTLE = """
INSERT INTO workflow_throttles AS t (tenant_id, workflow_id, step, subscriber, key, window_start, count)
VALUES (%(tenant)s, %(workflow)s, %(step)s, %(subscriber)s, %(key)s, now(), 1)
ON CONFLICT (tenant_id, workflow_id, step, subscriber, key) DO UPDATE SET
    window_start = CASE WHEN t.window_start + %(window)s * interval '1 second' <= now() THEN now()
                        ELSE t.window_start END,
    count = CASE WHEN t.window_start + %(window)s * interval '1 second' <= now() THEN 1 ELSE t.count + 1 END
WHERE t.window_start + %(window)s * interval '1 second' <= now() OR t.count < %(limit)s
RETURNING 1
"""


def pass_throttle(run: WorkflowRun, step: str, key: str, limit: int, window_seconds: float) -> bool:
    """Whether `run` passes its throttle step (counted when it does); one statement."""
    params = {"tenant": run.tenant_id, "workflow": run.workflow_id, "step": step, "subscriber": run.subscriber,
              "key": key, "window": float(window_seconds), "limit": int(limit)}  # fmt: skip
    with connections[WorkflowRun.objects.db].cursor() as cursor:
        cursor.execute(_THROTTLE, params)
        return cursor.fetchone() is not None


# A window keeps its items oldest trigger first, at most 100, with each one's trigger time in µs in
# `item_stamps`: schedulers advance runs in parallel, so a trigger may reach the step after a later one
# did (which then leads). A join sorts the items and the new one by trigger time and keeps the oldest
# 100 (one sort of at most 101 small values). An item without a time (appended by the version before,
# during an upgrade) takes the time of the item before it, or the window's opening: it keeps its place.
# A trigger older than the window's opening moves the opening back to its time; the end stays the
# leader's (its job closes the window then).
_JOIN = """
UPDATE workflow_digests d SET
    count = d.count + 1,
    opened_at = least(d.opened_at, %(triggered)s),
    (items, item_stamps) = (
        SELECT coalesce(jsonb_agg(k.item ORDER BY k.stamp, k.n), '[]'::jsonb),
               coalesce(jsonb_agg(k.stamp ORDER BY k.stamp, k.n), '[]'::jsonb)
        FROM (SELECT a.item, a.stamp, a.n
              FROM (SELECT x.item, x.n,
                           coalesce((d.item_stamps ->> (x.n - 1)::int)::bigint,
                                    max((d.item_stamps ->> (x.n - 1)::int)::bigint)
                                        OVER (ORDER BY x.n ROWS UNBOUNDED PRECEDING),
                                    (extract(epoch FROM d.opened_at) * 1000000)::bigint) AS stamp
                    FROM jsonb_array_elements(d.items) WITH ORDINALITY AS x(item, n)
                    UNION ALL
                    SELECT %(data)s::jsonb, jsonb_array_length(d.items) + 1,
                           (extract(epoch FROM %(triggered)s::timestamptz) * 1000000)::bigint) AS a
              ORDER BY a.stamp, a.n LIMIT %(max_items)s) AS k
    )
WHERE d.tenant_id = %(tenant)s AND d.workflow_id = %(workflow)s AND d.step = %(step)s
  AND d.subscriber = %(subscriber)s AND d.key = %(key)s AND d.status = 'open' AND d.closes_at > %(triggered)s
RETURNING d.id
"""
# An open window already over for this trigger (its leader has not closed it yet) takes no more
# joins: the new run opens the next one (the partial unique index allows one open window).
_OVER = """
UPDATE workflow_digests d SET status = 'closed'
WHERE d.tenant_id = %(tenant)s AND d.workflow_id = %(workflow)s AND d.step = %(step)s
  AND d.subscriber = %(subscriber)s AND d.key = %(key)s AND d.status = 'open' AND d.closes_at <= %(triggered)s
"""
_OPEN = """
INSERT INTO workflow_digests (tenant_id, workflow_id, step, subscriber, key, status, opened_at, closes_at, leader_id,
                              count, items, item_stamps)
VALUES (%(tenant)s, %(workflow)s, %(step)s, %(subscriber)s, %(key)s, 'open', %(triggered)s, %(closes)s, %(run)s,
        1, jsonb_build_array(%(data)s::jsonb),
        jsonb_build_array((extract(epoch FROM %(triggered)s::timestamptz) * 1000000)::bigint))
ON CONFLICT (tenant_id, workflow_id, step, subscriber, key) WHERE status = 'open' DO NOTHING
RETURNING closes_at
"""
_CLOSE = """
UPDATE workflow_digests SET status = 'closed'
WHERE leader_id = %(run)s AND step = %(step)s
RETURNING count, items
"""


def join_digest(run: WorkflowRun, step: dict[str, Any], now: datetime) -> datetime | None:
    """None when `run` joined an open window (it ends `digested`); else the end of the window it
    opened and leads. A statement each, retried while a peer opens the window at the same moment."""
    params = {
        "tenant": run.tenant_id, "workflow": run.workflow_id, "step": step["name"], "subscriber": run.subscriber,
        "key": key_value(run.data, step.get("key")), "data": json.dumps(run.data), "triggered": run.created_at,
        "closes": run.created_at + timedelta(seconds=float(step["window_seconds"])), "run": run.pk,
        "max_items": MAX_ITEMS,
    }  # fmt: skip
    with connections[WorkflowRun.objects.db].cursor() as cursor:
        for _ in range(5):
            cursor.execute(_JOIN, params)
            if cursor.fetchone() is not None:
                return None
            cursor.execute(_OVER, params)
            cursor.execute(_OPEN, params)
            row = cursor.fetchone()
            if row is not None:
                return max(row[0], now)
            # a peer's open window committed between the two: join it
    raise RuntimeError("the digest window stayed contended; the run is retried by the next batch")


def close_digest(run: WorkflowRun, step: str) -> dict[str, Any]:
    """Close the window `run` leads (no join after this) and return `{count, items}` as it ends."""
    with connections[WorkflowRun.objects.db].cursor() as cursor:
        cursor.execute(_CLOSE, {"run": run.pk, "step": step})
        row = cursor.fetchone()
    if row is None:
        return {"count": 1, "items": [run.data]}
    count, items = row
    return {"count": int(count), "items": json.loads(items) if isinstance(items, str) else items}


# A cancel naming subscribers while a fan-out with its cancellation key runs (the caller holds the
# fan-out's row, so no chunk is in flight): each named subscriber the fan-out has not reached yet (no
# run of its trigger) is recorded, and its run will be created `cancelled`; returns how many of those
# newly recorded are live members the fan-out will reach (recipients.topics.member_ahead_sql: one
# removed from the topic since the trigger gets its `cancelled` run uncounted; a non-member's record
# does nothing).
_CANCEL_AHEAD = """WITH named AS (
    SELECT DISTINCT subscriber FROM unnest(%(subscribers)s::text[]) AS n(subscriber)
), ahead AS (
    INSERT INTO workflow_fanout_cancels (fanout_id, subscriber)
    SELECT %(trigger)s, n.subscriber FROM named n
    WHERE NOT EXISTS (SELECT 1 FROM workflow_runs r WHERE r.trigger_id = %(trigger)s AND r.subscriber = n.subscriber)
    ON CONFLICT (fanout_id, subscriber) DO NOTHING
    RETURNING subscriber
)
SELECT count(*) FROM ahead a WHERE {member}"""


def cancel_ahead(fanout: Any, member_sql: Any, subscribers: list[str], *, using: str = "default") -> int:  # noqa: ANN401
    """Record `subscribers` the running `fanout` (its row locked by the caller) has not reached, so its
    chunks create their runs `cancelled`; returns how many of them are live members it will reach (one
    statement; `member_sql` is recipients.topics.member_ahead_sql)."""
    params = {"trigger": fanout.pk, "subscribers": subscribers, "topic": fanout.topic_id, "after": fanout.cursor,
              "boundary": fanout.boundary, "actor": fanout.actor}  # fmt: skip
    with connections[using].cursor() as cursor:
        cursor.execute(_CANCEL_AHEAD.format(member=member_sql("a.subscriber")), params)
        return int(cursor.fetchone()[0])


# A cancel's chunk, two statements whatever its size. First, up to %(chunk)s of the matching unfinished
# runs (in no order: along the partial index workflow_run_cancel_idx, where a sort would read every
# match each chunk; `picked`, read three times, is materialised once), and the pending jobs they wait on
# that no other unfinished run waits on (a fan-out chunk's job shared with runs not cancelled stays)
# cancelled, locked first (the scheduler's order: job, then run: a batch advancing one of them is
# waited for). Returns the runs' ids.
_CANCEL_PICK = """WITH picked AS (
    SELECT id, wake_id FROM workflow_runs
    WHERE tenant_id = %(tenant)s AND workflow_id = %(workflow)s AND cancellation_key = %(key)s
      AND status IN ('running', 'waiting') AND (%(test)s::boolean IS NULL OR test = %(test)s::boolean)
      {named}
    LIMIT %(chunk)s
), ids AS (
    SELECT array_agg(id) AS ids FROM picked
), lone AS (
    SELECT DISTINCT p.wake_id AS notification_id FROM picked p
    WHERE p.wake_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM workflow_runs o
        WHERE o.wake_id = p.wake_id AND o.status IN ('running', 'waiting') AND o.id NOT IN (SELECT id FROM picked))
), jobs AS (
    {jobs}
)
SELECT coalesce((SELECT ids FROM ids), '{{}}'), (SELECT count(*) FROM jobs)"""
# Second, those runs still unfinished end `cancelled`, waiting on nothing, their `waiting` step (a
# delay's, a digest's) `skipped` with reason `cancelled` (a narrow run's NULL steps stay: it took no
# step, every one is pending); returns how many, and the ids of the notifications their steps made.
_CANCEL_RUNS = """WITH stopped AS (
    UPDATE workflow_runs r
    SET status = 'cancelled', wake_id = NULL, updated_at = now(),
        steps = CASE WHEN r.steps IS NULL THEN NULL ELSE coalesce((
            SELECT jsonb_agg(CASE WHEN t.e ->> 'status' = 'waiting'
                                  THEN t.e || jsonb_build_object('status', 'skipped', 'reason', 'cancelled')
                                  ELSE t.e END ORDER BY t.i)
            FROM jsonb_array_elements(r.steps) WITH ORDINALITY AS t(e, i)), '[]'::jsonb) END
    WHERE r.id = ANY(%(ids)s::uuid[]) AND r.status IN ('running', 'waiting')
    RETURNING r.steps
)
SELECT (SELECT count(*) FROM stopped),
       ARRAY(SELECT e ->> 'notification_id' FROM stopped, jsonb_array_elements(stopped.steps) AS e
             WHERE e ->> 'notification_id' IS NOT NULL)"""


def cancel_runs(
    tenant_id: Any, workflow_id: Any, cancellation_key: str, *, subscribers: list[str] | None,  # noqa: ANN401
    test: bool | None, chunk: int, job_kinds: Sequence[str], using: str = "default",
) -> tuple[int, int, list[str]]:  # fmt: skip
    """Cancel up to `chunk` of the workflow's unfinished runs with this cancellation key (of
    `subscribers`, if given; of mode `test` unless None) with the jobs only they wait on, in two
    statements (the caller's transaction). Returns (runs picked, runs cancelled, the ids of the
    notifications their steps made): fewer picked than `chunk`, none are left."""
    named = "" if subscribers is None else "AND subscriber = ANY(%(subscribers)s::text[])"
    params = {"tenant": tenant_id, "workflow": workflow_id, "key": cancellation_key, "test": test,
              "subscribers": subscribers, "chunk": chunk, "kinds": list(job_kinds)}  # fmt: skip
    jobs = schedule.cancel_pending_jobs_sql("lone", "j.kind = ANY(%(kinds)s::text[])")
    with connections[using].cursor() as cursor:
        cursor.execute(_CANCEL_PICK.format(named=named, jobs=jobs), params)
        ids, _ = cursor.fetchone()
        if not ids:
            return 0, 0, []
        cursor.execute(_CANCEL_RUNS, {"ids": ids})
        stopped, notification_ids = cursor.fetchone()
    return len(ids), int(stopped), list(notification_ids)


# A batch's runs, each to its new state, in one statement: only while each still waits on the job the
# batch holds (its wake_id) and is unfinished.
_RECORD_RUNS = """WITH recorded AS (
    UPDATE workflow_runs r
    SET status = u.status, step_index = u.step_index, steps = u.steps, wake_id = u.wake, digest = u.digest,
        updated_at = now()
    FROM jsonb_to_recordset(%(runs)s::jsonb)
         AS u(id uuid, old uuid, status text, step_index int, steps jsonb, wake uuid, digest jsonb)
    WHERE r.id = u.id AND r.wake_id = u.old AND r.status IN ('running', 'waiting')
    RETURNING 1
) SELECT count(*) FROM recorded"""


def record_runs(changes: list[tuple[Any, Any, str, int, list[dict[str, Any]], Any, Any]], *, using: str) -> None:  # noqa: ANN401
    """Each `(run id, the wake id it waited on, status, step_index, steps, new wake id or None, digest)`;
    raises when a run no longer waited on that job (the batch is undone)."""
    if not changes:
        return
    runs = [{"id": run, "old": old, "status": str(status), "step_index": index, "steps": steps, "wake": wake,
             "digest": digest} for run, old, status, index, steps, wake, digest in changes]  # fmt: skip
    # one JSON document: a share's 500 runs as seven arrays went through psycopg's list dumpers, in
    # Python, and a json.dumps per run (≈ 9 % of a scheduler's time sending a broadcast, sampled). The
    # states hold StepStatus members, not plain for orjson (core.plain_json): json.dumps writes it.
    (recorded,) = hot_sql.fetchone(_RECORD_RUNS, {"runs": json_text(runs, DjangoJSONEncoder)}, using=using)
    if recorded != len(changes):
        raise RuntimeError(f"{len(changes) - recorded} run(s) changed under the batch's lock")
