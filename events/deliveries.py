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
from events import statements

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
    return statements.CLAIM, {"n": n, "lease": float(lease_seconds), "token": token}


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
    return {row[0] for row in _run(cursor, statements.RECORD, params, fetch=True)}


def disabled_reason(hours: float) -> str:
    return f"failing without a break for {hours:g} hours"


def _run(cursor: Any, sql: str, params: dict[str, Any], *, fetch: bool) -> list[tuple]:  # noqa: ANN401
    if cursor is None:
        with connection.cursor() as own:
            own.execute(sql, params)
            return own.fetchall() if fetch else []
    cursor.execute(sql, params, prepare=pooling.prepare())  # psycopg: prepared once per connection unless pooled
    return cursor.fetchall() if fetch else []
