"""The event lane's two statements: claim due deliveries, record their results.

The dispatcher's event lane (dispatch.events) calls these on its database thread, one statement
per batch each, never inside a transaction that spans a send:

- `claim_due(n, lease_seconds, token)`: pending deliveries due now and not leased (or whose lease
  ran out: a lane that dies leaves rows that fall due again by themselves), of enabled endpoints,
  oldest first, `FOR UPDATE SKIP LOCKED`; it writes only the lease and the attempt count, no
  indexed column, so the claim is a HOT update. With room left, the same statement fans out the
  outbox (events marked `fanout_pending`, oldest first, `SKIP LOCKED`): their deliveries are
  inserted already leased to this claim. With room left after that, it opens the oldest batch of
  delivery outcomes (`event_outcome_batches`, written by the dispatcher's record statement,
  events.emit) into events, which the next claim fans out. So the statement that records
  outcomes writes one row per batch, and events and deliveries are made on the lane, which holds
  back while the dispatcher has a backlog of notifications (dispatch.events).
- `record(results)`: settles the batch fenced by each row's lock token (delivered, failed, retry
  after a delay, or given back untried), writes one attempt row per try, keeps each endpoint's
  `failing_since` (the start of its unbroken run of failures, on the database's clock) and
  disables an endpoint whose run has lasted OMNIPOST_EVENT_ENDPOINT_DISABLE_AFTER_HOURS: its
  pending deliveries become `failed` (kept for `recover`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

from core import pooling
from events.emit import open_outcomes_ctes

DELIVERED, RETRY, FAILED, DEFERRED = "delivered", "retry", "failed", "deferred"


@dataclass(slots=True)
class Claimed:
    delivery_id: int
    lock_token: uuid.UUID
    event_id: str  # public: evt_<hex>, the webhook-id
    event_type: str
    endpoint_id: int
    tenant_key: str
    attempt: int  # this try's number (1 for the first)
    body: bytes  # the event's payload, exactly as POSTed and signed
    url: str
    secret_token: str  # ciphertext: opened only when the lane builds the endpoint's signer
    previous_secret_token: str | None
    secret_rotated_at: datetime | None
    endpoint_version: datetime  # updated_at: the lane rebuilds its signer when it changes


@dataclass(slots=True)
class Result:
    delivery_id: int
    lock_token: uuid.UUID
    kind: str  # delivered | retry | failed | deferred
    delay: float = 0.0  # seconds before the next try, for a retry
    http_status: int | None = None
    error_code: str = ""
    duration_ms: int = 0
    attempted_at: datetime | None = None


_CLAIM_SQL = """
    WITH due AS (
        SELECT d.id FROM event_deliveries d
        WHERE d.status = 'pending' AND d.next_attempt_at <= now()
          AND (d.locked_until IS NULL OR d.locked_until < now())
          AND EXISTS (SELECT FROM event_endpoints e WHERE e.id = d.endpoint_id AND e.enabled)
        ORDER BY d.next_attempt_at, d.id
        LIMIT %(n)s
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE event_deliveries d
        SET lock_token = %(token)s, locked_until = now() + make_interval(secs => %(lease)s),
            attempts = d.attempts + 1
        -- by primary key whatever the plan: a join with `due` was planned, generically, as a hash
        -- join over a sequential scan of the whole table (357 ms a claim at 20,000 deliveries)
        WHERE d.id = ANY(ARRAY(SELECT id FROM due))
        RETURNING d.id, d.event_id, d.endpoint_id, d.tenant_id, d.attempts, d.next_attempt_at
    ), unspread AS (
        -- the outbox: events not fanned out yet, oldest first, as many as the due deliveries left room for
        SELECT ev.id FROM events ev
        WHERE ev.fanout_pending
        ORDER BY ev.id
        LIMIT greatest(%(n)s - (SELECT count(*) FROM claimed), 0)
        FOR UPDATE SKIP LOCKED
    ), spread AS (
        UPDATE events ev SET fanout_pending = false
        WHERE ev.id = ANY(ARRAY(SELECT id FROM unspread))
        RETURNING ev.id, ev.tenant_id, ev.type
    ), fanned AS (
        -- one delivery per endpoint enabled and subscribed to the event now, leased to this claim;
        -- one that `recover` made meanwhile is left as it is
        INSERT INTO event_deliveries (tenant_id, event_id, endpoint_id, status, attempts, next_attempt_at, lock_token,
                                      locked_until, last_error_code, created_at)
        SELECT s.tenant_id, s.id, e.id, 'pending', 1, now(), %(token)s, now() + make_interval(secs => %(lease)s),
               '', now()
        FROM spread s
        JOIN event_endpoints e ON e.tenant_id = s.tenant_id AND e.enabled
                              AND (e.event_types ? s.type OR e.event_types ? '*')
        ON CONFLICT (endpoint_id, event_id) DO NOTHING
        RETURNING id, event_id, endpoint_id, tenant_id, attempts, next_attempt_at
    ), boxed AS (
        -- room left still: the oldest batch of outcomes becomes events (fanned out by the next claim)
        SELECT b.id FROM event_outcome_batches b
        WHERE (SELECT count(*) FROM claimed) + (SELECT count(*) FROM unspread) < %(n)s
        ORDER BY b.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ), opened AS (
        DELETE FROM event_outcome_batches b WHERE b.id = ANY(ARRAY(SELECT id FROM boxed))
        RETURNING b.*
    ), {OPEN}, taken AS (
        SELECT * FROM claimed UNION ALL SELECT * FROM fanned
    )
    SELECT * FROM (
        SELECT c.id, 'evt_' || replace(c.event_id::text, '-', ''), ev.type, c.endpoint_id, c.tenant_id::text,
               c.attempts, ev.payload::text, e.url, e.secret, e.previous_secret, e.secret_rotated_at, e.updated_at
        FROM taken c
        JOIN events ev ON ev.id = c.event_id
        JOIN event_endpoints e ON e.id = c.endpoint_id
        ORDER BY c.next_attempt_at, c.id
    ) claims
    UNION ALL  -- a row without a delivery: how many events the opened batch made
    SELECT NULL, NULL, NULL, NULL, NULL, (SELECT count(*) FROM oc_new)::int, NULL, NULL, NULL, NULL, NULL, NULL
    WHERE EXISTS (SELECT FROM opened)
""".replace("{OPEN}", open_outcomes_ctes("opened", prefix="oc"))


class ClaimedBatch(list):
    """A claim's deliveries (`Claimed`), and `opened`: the events it made from a batch of outcomes,
    which the next claim fans out (so the lane claims again at once)."""

    opened: int = 0


def claim_due(n: int, lease_seconds: float, token: uuid.UUID, *, cursor: Any = None) -> ClaimedBatch:  # noqa: ANN401
    """Lease up to `n` due deliveries with `token` (one statement). `cursor`: a psycopg cursor to
    run it on, prepared (the dispatcher's server-side binding one); None: Django's."""
    if n <= 0:
        return ClaimedBatch()
    batch = ClaimedBatch()
    for did, eid, etype, epid, tkey, attempt, payload, url, secret, previous, rotated, version in _run(
        cursor, *claim_statement(n, lease_seconds, token), fetch=True
    ):
        if did is None:
            batch.opened = attempt
        else:
            batch.append(Claimed(did, token, eid, etype, epid, tkey, attempt, payload.encode(), url, secret, previous,
                                 rotated, version))  # fmt: skip
    return batch


def claim_statement(n: int, lease_seconds: float, token: uuid.UUID) -> tuple[str, dict[str, Any]]:
    """The claim of up to `n` due deliveries, and its parameters."""
    return _CLAIM_SQL, {"n": n, "lease": float(lease_seconds), "token": token}


_RECORD_SQL = """
    WITH r AS (
        SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(kinds)s::text[], %(delays)s::float8[],
                             %(statuses)s::int[], %(codes)s::text[], %(durations)s::int[], %(at)s::timestamptz[])
            AS r(id, lock_token, kind, delay, http_status, code, duration_ms, attempted_at)
    ), settled AS (
        UPDATE event_deliveries d
        SET status = CASE r.kind WHEN 'delivered' THEN 'delivered' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
            attempts = CASE WHEN r.kind = 'deferred' THEN greatest(d.attempts - 1, 0) ELSE d.attempts END,
            next_attempt_at = now() + make_interval(secs => r.delay),
            lock_token = NULL, locked_until = NULL,
            last_http_status = CASE WHEN r.kind = 'deferred' THEN d.last_http_status ELSE r.http_status END,
            last_error_code = CASE WHEN r.kind = 'deferred' THEN d.last_error_code ELSE r.code END,
            delivered_at = CASE WHEN r.kind = 'delivered' THEN now() ELSE d.delivered_at END
        FROM r
        -- fenced by the token alone (only a claim sets it; settling, recover and re-enabling clear
        -- it): a status condition here made the planner walk the whole due index instead of the pkey
        WHERE d.id = r.id AND d.lock_token = r.lock_token
        RETURNING d.id, d.tenant_id, d.event_id, d.endpoint_id, r.kind, r.http_status, r.code, r.duration_ms,
                  r.attempted_at
    ), logged AS (
        INSERT INTO event_attempts (tenant_id, event_id, endpoint_id, event_type, status, http_status, error_code,
                                    duration_ms, attempted_at)
        SELECT s.tenant_id, s.event_id, s.endpoint_id, ev.type,
               CASE WHEN s.kind = 'delivered' THEN 'delivered' ELSE 'failed' END, s.http_status, s.code,
               s.duration_ms, s.attempted_at
        FROM settled s JOIN events ev ON ev.id = s.event_id
        WHERE s.kind <> 'deferred'
    ), last_success AS (
        SELECT s.endpoint_id, max(s.attempted_at) FILTER (WHERE s.kind = 'delivered') AS at
        FROM settled s WHERE s.kind <> 'deferred' GROUP BY s.endpoint_id
    ), runs AS (
        -- failing_since after this batch: a success ends the run (a failure after it starts a new
        -- one, now); failures alone keep the run's start or start it now
        SELECT l.endpoint_id,
               CASE WHEN NOT EXISTS (SELECT FROM settled s
                                     WHERE s.endpoint_id = l.endpoint_id AND s.kind IN ('retry', 'failed')
                                       AND (l.at IS NULL OR s.attempted_at > l.at)) THEN NULL
                    WHEN l.at IS NULL THEN coalesce(e.failing_since, now())
                    ELSE now() END AS since
        FROM last_success l
        JOIN event_endpoints e ON e.id = l.endpoint_id
    ), tracked AS (
        UPDATE event_endpoints e
        SET failing_since = runs.since,
            enabled = e.enabled AND NOT coalesce(runs.since <= now() - make_interval(secs => %(disable_after)s), false),
            disabled_reason = CASE WHEN e.enabled AND runs.since <= now() - make_interval(secs => %(disable_after)s)
                                   THEN %(reason)s ELSE e.disabled_reason END,
            updated_at = CASE WHEN e.enabled AND runs.since <= now() - make_interval(secs => %(disable_after)s)
                              THEN now() ELSE e.updated_at END
        FROM runs
        WHERE e.id = runs.endpoint_id
          AND (e.failing_since IS DISTINCT FROM runs.since
               OR (e.enabled AND runs.since <= now() - make_interval(secs => %(disable_after)s)))
        RETURNING e.id, e.enabled
    ), shelved AS (
        -- a disabled endpoint's undelivered events are kept, not attempted: `recover` re-sends them
        UPDATE event_deliveries d
        SET status = 'failed', lock_token = NULL, locked_until = NULL
        FROM tracked t
        WHERE NOT t.enabled AND d.endpoint_id = t.id AND d.status = 'pending'
          AND d.id <> ALL(%(ids)s::bigint[])
          -- a one-time gate: nothing is read unless this batch disabled an endpoint
          AND EXISTS (SELECT FROM tracked WHERE NOT enabled)
    )
    SELECT id FROM settled
"""


def record(results: Sequence[Result], *, cursor: Any = None) -> set[int]:  # noqa: ANN401
    """Settle a batch (one statement); returns the delivery ids that were still ours. `cursor`: as
    for claim_due."""
    if not results:
        return set()
    hours = float(settings.OMNIPOST_EVENT_ENDPOINT_DISABLE_AFTER_HOURS)
    params = {
        "ids": [r.delivery_id for r in results],
        "tokens": [r.lock_token for r in results],
        "kinds": [r.kind for r in results],
        "delays": [float(r.delay) for r in results],
        "statuses": [r.http_status for r in results],
        "codes": [r.error_code for r in results],
        "durations": [int(r.duration_ms) for r in results],
        "at": [r.attempted_at for r in results],
        "disable_after": hours * 3600.0,
        "reason": disabled_reason(hours),
    }
    return {row[0] for row in _run(cursor, _RECORD_SQL, params, fetch=True)}


def disabled_reason(hours: float) -> str:
    return f"failing without a break for {hours:g} hours"


def _run(cursor: Any, sql: str, params: dict[str, Any], *, fetch: bool) -> list[tuple]:  # noqa: ANN401
    if cursor is None:
        with connection.cursor() as own:
            own.execute(sql, params)
            return own.fetchall() if fetch else []
    cursor.execute(sql, params, prepare=pooling.prepare())  # psycopg: prepared once per connection unless pooled
    return cursor.fetchall() if fetch else []
