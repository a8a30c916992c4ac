"""The database side of delivering a batch: start it, then record every outcome.

`start_batch` moves the claimed notifications to `dispatching` with one conditional UPDATE and
returns what the providers need; a notification that is no longer sendable (cancelled,
delivered, failed) comes back in `skipped`, so it is acked and never sent.

`record_outcomes` writes a whole batch's results in one short transaction with a fixed number of
statements: ack (DELETE … RETURNING, fenced by lock_token), release for retries, the
notifications' new statuses, one attempt row per try, and dead-letter entries. Items whose lease
was lost to a peer change nothing here (the peer owns them now).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connections, transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Now

from core import crypto
from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt, Notification, Status
from queueing import queue
from queueing.queue import Lease

SENDABLE = (Status.QUEUED, Status.RETRYING, Status.DISPATCHING)
_SEND_FIELDS = (
    "id",
    "tenant_id",
    "channel",
    "recipient",
    "subject",
    "body",
    "metadata",
    "created_at",
    "provider_id",
    "attempt_count",
    "attempt_offset",
)


@dataclass(slots=True)
class Prepared:
    lease: Lease
    notification_id: uuid.UUID
    tenant_id: uuid.UUID
    channel: str
    recipient_token: str
    subject: str
    body: str
    metadata: dict
    created_at: datetime
    provider_id: int
    attempt_number: int  # the number this try will get (all tries, across redrives)
    attempts_this_run: int  # tries since the last redrive, this one included

    def recipient(self) -> str:
        return crypto.decrypt(self.recipient_token, where=f"Notification.recipient of row {self.notification_id}")


@dataclass(slots=True)
class Outcome:
    """What became of one claimed item. `kind` is delivered | retry | failed | dead_lettered |
    skipped (not sendable) | deferred (given back untried, e.g. on shutdown)."""

    lease: Lease
    kind: str
    attempt: DeliveryAttempt | None = None
    retry_delay: float = 0.0
    error_code: str = ""
    failure_reason: str = ""
    failure_class: str = ""
    status_code: int | None = None


@dataclass(slots=True)
class Recorded:
    acked: set[int] = field(default_factory=set)
    released: set[int] = field(default_factory=set)
    lost: list[Outcome] = field(default_factory=list)


def _is_pg(using: str) -> bool:
    return connections[using].vendor == "postgresql"


def start_batch(leases: Sequence[Lease], *, using: str = "default") -> tuple[list[Prepared], list[Lease]]:
    """One UPDATE … RETURNING: sendable notifications → dispatching, with what a send needs."""
    if not leases:
        return [], []
    by_notification = {lease.notification_id: lease for lease in leases}
    ids = list(by_notification)
    rows = _dispatching_pg(ids, using) if _is_pg(using) else _dispatching_portable(ids, using)
    prepared = []
    for nid, tenant_id, channel, recipient, subject, body, metadata, created_at, provider_id, count, offset in rows:
        nid = nid if isinstance(nid, uuid.UUID) else uuid.UUID(str(nid))
        prepared.append(
            Prepared(
                lease=by_notification.pop(nid),
                notification_id=nid,
                tenant_id=tenant_id,
                channel=channel,
                recipient_token=str(recipient),
                subject=subject,
                body=body,
                metadata=json.loads(metadata) if isinstance(metadata, str) else metadata,
                created_at=created_at,
                provider_id=provider_id,
                attempt_number=count + 1,
                attempts_this_run=count - offset + 1,
            )
        )
    return prepared, list(by_notification.values())


def _dispatching_pg(ids: list[uuid.UUID], using: str) -> list[tuple]:
    with connections[using].cursor() as cursor:
        cursor.execute(
            """
            UPDATE notifications SET status = 'dispatching', updated_at = now()
            WHERE id = ANY(%s) AND status IN ('queued', 'retrying', 'dispatching')
            RETURNING id, tenant_id, channel, recipient, subject, body, metadata, created_at, provider_id,
                      attempt_count, attempt_offset
            """,
            [ids],
        )
        return cursor.fetchall()


def _dispatching_portable(ids: list[uuid.UUID], using: str) -> list[tuple]:
    with transaction.atomic(using=using):
        sendable = Notification.objects.using(using).filter(pk__in=ids, status__in=SENDABLE)
        rows = list(sendable.values_list(*_SEND_FIELDS))
        sendable.update(status=Status.DISPATCHING, updated_at=Now())
    return rows


_FINAL_STATUS = {
    "delivered": Status.DELIVERED,
    "failed": Status.FAILED,
    "dead_lettered": Status.DEAD_LETTERED,
    "retry": Status.RETRYING,
    "deferred": Status.QUEUED,
}


def record_outcomes(outcomes: Sequence[Outcome], *, using: str = "default") -> Recorded:
    """Write a batch's results atomically; returns what was acked, released, and lost to peers."""
    result = Recorded()
    if not outcomes:
        return result
    to_ack = [o for o in outcomes if o.kind in ("delivered", "failed", "dead_lettered", "skipped")]
    retries = [o for o in outcomes if o.kind == "retry"]
    deferred = [o for o in outcomes if o.kind == "deferred"]
    with transaction.atomic(using=using):
        result.acked = queue.ack([o.lease for o in to_ack], using=using)
        if retries:
            result.released |= queue.release([o.lease for o in retries], [o.retry_delay for o in retries], using=using)
        if deferred:
            result.released |= queue.release([o.lease for o in deferred], 0.0, refund_attempt=True, using=using)
        ours = result.acked | result.released
        kept = [o for o in outcomes if o.lease.item_id in ours]
        result.lost = [o for o in outcomes if o.lease.item_id not in ours]
        changes = [o for o in kept if o.kind in _FINAL_STATUS]
        if changes:
            _update_notifications(changes, using)
        attempts = [o.attempt for o in kept if o.attempt is not None]
        if attempts:
            DeliveryAttempt.objects.using(using).bulk_create(attempts)
        dead = [o for o in kept if o.kind in ("failed", "dead_lettered")]
        if dead:
            DeadLetter.objects.using(using).bulk_create(
                [
                    DeadLetter(
                        tenant_id=o.lease.tenant_id,
                        notification_id=o.lease.notification_id,
                        provider_id=o.lease.provider_id,
                        failure_class=o.failure_class,
                        failure_reason=o.failure_reason[:2000],
                        error_code=o.error_code,
                        last_status_code=o.status_code,
                        attempt_count=o.attempt.number if o.attempt else 0,
                    )
                    for o in dead
                ]
            )
    return result


def _update_notifications(changes: Sequence[Outcome], using: str) -> None:
    """Status, attempt count, last error and delivered_at for every changed notification."""
    ids = [o.lease.notification_id for o in changes]
    statuses = [_FINAL_STATUS[o.kind].value for o in changes]
    counts = [o.attempt.number if o.attempt else -1 for o in changes]
    codes = [o.error_code for o in changes]
    if _is_pg(using):
        with connections[using].cursor() as cursor:
            cursor.execute(
                """
                UPDATE notifications n
                SET status = u.status,
                    attempt_count = CASE WHEN u.attempts >= 0 THEN u.attempts ELSE n.attempt_count END,
                    last_error_code = u.code,
                    delivered_at = CASE WHEN u.status = 'delivered' THEN now() ELSE n.delivered_at END,
                    enqueued_at = CASE WHEN u.status = 'retrying' THEN now() ELSE n.enqueued_at END,
                    updated_at = now()
                FROM unnest(%s::uuid[], %s::text[], %s::int[], %s::text[]) AS u(id, status, attempts, code)
                WHERE n.id = u.id AND n.status = 'dispatching'
                """,
                [ids, statuses, counts, codes],
            )
        return
    Notification.objects.using(using).filter(pk__in=ids, status=Status.DISPATCHING).update(
        status=Case(*[When(pk=i, then=Value(s)) for i, s in zip(ids, statuses, strict=True)]),
        attempt_count=Case(
            *[When(pk=i, then=Value(c)) for i, c in zip(ids, counts, strict=True) if c >= 0],
            default=F("attempt_count"),
        ),
        last_error_code=Case(*[When(pk=i, then=Value(c)) for i, c in zip(ids, codes, strict=True)]),
        delivered_at=Case(
            *[When(pk=i, then=Now()) for i, s in zip(ids, statuses, strict=True) if s == Status.DELIVERED],
            default=F("delivered_at"),
        ),
        updated_at=Now(),
    )
