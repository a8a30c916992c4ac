"""Redrive and discard of dead letters: the one service behind the admin, the API and `dlq_redrive`.

`redrive()` works in batches; each batch is one short transaction with a fixed number of statements
whatever its size:

1. UPDATE dead_letter_queue … WHERE id = ANY(ids) AND status = 'open' AND the notification is
   failed or dead_lettered RETURNING … — the compare-and-set: of two operators redriving the same
   entry at the same moment, the second finds it no longer open and re-queues nothing (its rows
   are locked in id order first, so overlapping batches queue up rather than deadlock);
2. UPDATE notifications SET status = 'queued', attempt_offset = attempt_count … WHERE status IN
   ('failed', 'dead_lettered') RETURNING the routing data — a fresh attempt budget; a delivered
   notification never matches, so it is never sent again;
3. `queueing.queue.enqueue` (INSERT … ON CONFLICT DO NOTHING, and the dispatchers' doorbell);
4. one INSERT of audit events;
5. only when something was refused: one SELECT that says why.

`discard()` is step 1 with status 'discarded' plus the audit INSERT. `redrive_matching()` takes a
snapshot of the matching entries and feeds them to the same batches at a given rate, sleeping
between batches on an interruptible wait, so a bulk redrive neither floods a recovering provider
nor holds row locks for long.

Lock order (dead_letter_queue → notifications → queue_state) never meets the dispatcher's
(queue_state → notifications → dead_letter_queue) on the same notification: a failed or
dead-lettered notification has no live queue item.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import QuerySet

from core.models import AuditEvent, Tenant
from dlq import statements
from dlq.models import DeadLetter
from notifications import statements as notification_statements
from notifications.models import Status
from queueing.queue import NewItem, enqueue

logger = logging.getLogger("omnipost.dlq")

BATCH_SIZE = 500
# With a rate, a batch holds about this many seconds' worth of entries (at most BATCH_SIZE), so
# entries leave in small, evenly spaced groups rather than one burst a second.
PACE_SECONDS = 0.1
REDRIVABLE = (Status.FAILED, Status.DEAD_LETTERED)

# Why an entry was not redriven or discarded: code → what an operator reads.
NOT_FOUND = "not_found"
NOT_OPEN = "not_open"
ALREADY_DELIVERED = "already_delivered"
NOT_REDRIVABLE = "not_redrivable"
REASONS = {
    NOT_FOUND: "no such dead-letter entry",
    NOT_OPEN: "the entry is no longer open (already redriven or discarded)",
    ALREADY_DELIVERED: "the notification was already delivered; it is never sent again",
    NOT_REDRIVABLE: "the notification is neither failed nor dead-lettered",
}

TenantRef = Tenant | uuid.UUID | str | None


@dataclass(slots=True)
class RedriveResult:
    redriven: list[uuid.UUID] = field(default_factory=list)
    refused: dict[uuid.UUID, str] = field(default_factory=dict)  # entry id → reason code (REASONS)

    def merge(self, other: RedriveResult) -> None:
        self.redriven += other.redriven
        self.refused.update(other.refused)


@dataclass(slots=True)
class DiscardResult:
    discarded: list[uuid.UUID] = field(default_factory=list)
    refused: dict[uuid.UUID, str] = field(default_factory=dict)

    def merge(self, other: DiscardResult) -> None:
        self.discarded += other.discarded
        self.refused.update(other.refused)


@dataclass(frozen=True, slots=True)
class RedriveFilters:
    """Which open entries a bulk redrive takes (all given filters must match)."""

    tenant: TenantRef = None
    failure_class: str | None = None
    provider: str | None = None  # provider name
    created_after: datetime | None = None


@dataclass(slots=True)
class BulkResult:
    matched: int  # entries in the snapshot (after `limit`); a dry run stops here
    redriven: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # reason code → entries
    batches: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    interrupted: bool = False


# --- helpers ---------------------------------------------------------------------------------------


def _tenant_id(tenant: TenantRef) -> uuid.UUID | None:
    if tenant is None:
        return None
    return tenant.pk if isinstance(tenant, Tenant) else uuid.UUID(str(tenant))


def _as_ids(entries: QuerySet[DeadLetter] | Iterable[Any]) -> tuple[list[uuid.UUID], dict[Any, str]]:
    """Entry ids in order without duplicates; values that are not UUIDs come back as refused."""
    if isinstance(entries, QuerySet):
        entries = entries.values_list("pk", flat=True)
    ids: dict[uuid.UUID, None] = {}
    bad: dict[Any, str] = {}
    for value in entries:
        try:
            ids[value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))] = None
        except ValueError:
            bad[value] = NOT_FOUND
    return list(ids), bad


def _chunks(ids: Sequence[uuid.UUID], size: int) -> Iterable[list[uuid.UUID]]:
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])


def _explain(
    ids: Iterable[uuid.UUID], tenant_id: uuid.UUID | None, using: str, *, redrive: bool
) -> dict[uuid.UUID, str]:
    """One SELECT: why each of `ids` was left alone (another tenant's entry is simply not found)."""
    ids = list(ids)
    if not ids:
        return {}
    entries = DeadLetter.objects.using(using)
    if tenant_id is not None:
        entries = entries.for_tenant(tenant_id)
    reasons = dict.fromkeys(ids, NOT_FOUND)
    for pk, status, note_status in entries.filter(pk__in=ids).values_list("pk", "status", "notification__status"):
        if status != DeadLetter.Status.OPEN:
            reasons[pk] = NOT_OPEN
        elif redrive and note_status == Status.DELIVERED:
            reasons[pk] = ALREADY_DELIVERED
        elif redrive:
            reasons[pk] = NOT_REDRIVABLE
    return reasons


def _audit(action: str, actor: str, rows: Iterable[tuple], extra: dict[str, Any] | None = None) -> None:
    """One INSERT: an audit event per (entry id, notification id, tenant id, failure class, error code)."""
    AuditEvent.bulk_record(
        [
            AuditEvent(
                actor=actor, action=action, target_type="dlq.deadletter", target_id=str(pk), tenant_id=tenant_id,
                details={"notification_id": str(nid), "failure_class": fclass, "error_code": code, **(extra or {})},
            )  # fmt: skip
            for pk, nid, tenant_id, fclass, code in rows
        ]
    )


# --- redrive ---------------------------------------------------------------------------------------

# A redrive batch: the entries are taken (dlq.statements.TAKE_FOR_REDRIVE), their notifications
# re-queued (notifications.statements.REQUEUE_DEAD_LETTERED); an entry whose notification was not
# re-queued goes back to open (dlq.statements.REOPEN).


def _requeue_items(rows: Iterable[tuple], entry_of: dict[uuid.UUID, uuid.UUID], delays: dict[uuid.UUID, float]):  # noqa: ANN202
    return [
        NewItem(
            notification_id=nid, tenant_id=tenant_id, provider_id=provider_id, queue_name=queue_name,
            priority=priority, payload={"channel": channel, "dead_letter_id": str(entry_of[nid])},
            delay_seconds=delays.get(nid, 0.0),
        )  # fmt: skip
        for nid, tenant_id, provider_id, queue_name, priority, channel in rows
    ]


def _redrive_batch(
    ids: list[uuid.UUID], actor: str, tenant_id: uuid.UUID | None, using: str, spread: Callable[[int], float] | None
) -> RedriveResult:
    with transaction.atomic(using=using):
        taken, requeued = _take_and_requeue(ids, actor, tenant_id, using)
        entry_of = {nid: pk for pk, nid, *_ in taken}
        delays = {row[0]: spread(i) for i, row in enumerate(requeued)} if spread else {}
        enqueue(_requeue_items(requeued, entry_of, delays), using=using)
        _audit("dead_letter.redriven", actor, taken)
        done = [pk for pk, *_ in taken]
        refused = _explain(set(ids) - set(done), tenant_id, using, redrive=True)
    return RedriveResult(done, refused)


def _take_and_requeue(
    ids: list[uuid.UUID], actor: str, tenant_id: uuid.UUID | None, using: str
) -> tuple[list[tuple], list[tuple]]:
    with connections[using].cursor() as cursor:
        cursor.execute(statements.TAKE_FOR_REDRIVE, {"ids": ids, "actor": actor, "tenant": tenant_id})
        taken = cursor.fetchall()
        if not taken:
            return [], []
        cursor.execute(notification_statements.REQUEUE_DEAD_LETTERED, [[row[1] for row in taken]])
        requeued = cursor.fetchall()
        if len(requeued) != len(taken):
            back = {row[0] for row in requeued}
            lost = [row for row in taken if row[1] not in back]
            logger.warning("%d notification(s) changed state during a redrive; their entries stay open", len(lost))
            cursor.execute(statements.REOPEN, [[row[0] for row in lost]])
            taken = [row for row in taken if row[1] in back]
    return taken, requeued


def redrive(
    entries: QuerySet[DeadLetter] | Iterable[Any],
    *,
    actor: str,
    tenant: TenantRef = None,
    rate: float | None = None,
    batch_size: int = BATCH_SIZE,
    using: str = "default",
) -> RedriveResult:
    """Re-queue the notifications of open entries with a fresh attempt budget; one transaction per batch.

    `tenant` restricts to that tenant's entries (others are refused as not_found). `rate`
    (entries/second) spreads the re-queued items' `available_at` over time instead of releasing
    them at once; nothing sleeps. Refusals: not_found, not_open, already_delivered, not_redrivable.
    """
    ids, bad = _as_ids(entries)
    result = RedriveResult(refused=dict(bad))
    tenant_id = _tenant_id(tenant)
    offset = 0
    for chunk in _chunks(ids, batch_size):
        base = offset
        spread = (lambda i, base=base: (base + i) / rate) if rate else None
        batch = _redrive_batch(chunk, actor, tenant_id, using, spread)
        offset += len(batch.redriven)
        result.merge(batch)
    if ids:
        logger.info("%s redrove %d dead letter(s); %d refused", actor, len(result.redriven), len(result.refused))
    return result


# --- discard ---------------------------------------------------------------------------------------


def _discard_batch(ids: list[uuid.UUID], actor: str, tenant_id: uuid.UUID | None, using: str) -> DiscardResult:
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute(statements.DISCARD, {"ids": ids, "actor": actor, "tenant": tenant_id})
            taken = cursor.fetchall()
        _audit("dead_letter.discarded", actor, taken)
        done = [row[0] for row in taken]
        refused = _explain(set(ids) - set(done), tenant_id, using, redrive=False)
    return DiscardResult(done, refused)


def discard(
    entries: QuerySet[DeadLetter] | Iterable[Any],
    *,
    actor: str,
    tenant: TenantRef = None,
    batch_size: int = BATCH_SIZE,
    using: str = "default",
) -> DiscardResult:
    """Close open entries without sending anything (the notification stays failed/dead_lettered)."""
    ids, bad = _as_ids(entries)
    result = DiscardResult(refused=dict(bad))
    tenant_id = _tenant_id(tenant)
    for chunk in _chunks(ids, batch_size):
        result.merge(_discard_batch(chunk, actor, tenant_id, using))
    if ids:
        logger.info("%s discarded %d dead letter(s); %d refused", actor, len(result.discarded), len(result.refused))
    return result


# --- bulk ------------------------------------------------------------------------------------------


def matching(filters: RedriveFilters, *, using: str = "default") -> QuerySet[DeadLetter]:
    """Open entries that match `filters` and whose notification can be redriven, oldest first."""
    entries = DeadLetter.objects.using(using).open()
    if filters.tenant is not None:
        entries = entries.for_tenant(filters.tenant)  # a key's Tenant: its mode's entries only
    if filters.failure_class:
        entries = entries.filter(failure_class=filters.failure_class)
    if filters.provider:
        entries = entries.filter(provider__name=filters.provider)
    if filters.created_after is not None:
        entries = entries.filter(created_at__gte=filters.created_after)
    # Ordered by created_at alone: the (status, created_at) indexes serve it without a sort.
    return entries.filter(notification__status__in=REDRIVABLE).order_by("created_at")


def batch_size_for(rate: float | None, batch_size: int = BATCH_SIZE) -> int:
    if not rate:
        return batch_size
    return max(1, min(batch_size, math.floor(rate * PACE_SECONDS)))


def redrive_matching(
    filters: RedriveFilters,
    *,
    actor: str,
    limit: int | None = None,
    rate: float | None = None,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
    batch_size: int = BATCH_SIZE,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], bool] | None = None,
    stop: threading.Event | None = None,
    using: str = "default",
) -> BulkResult:
    """Redrive every open entry matching `filters` (oldest first, at most `limit`) at `rate` entries/s.

    The entries are fixed when the run starts, so notifications that fail again during the run are
    not chased. Batches of `batch_size_for(rate)` go through `redrive()`'s batch transaction; before
    each, the run waits until `start + redriven / rate`. `sleep(seconds)` returns True when the run
    should stop (default: `stop.wait`, so a signal handler setting `stop` ends the wait at once).
    `progress(done, total)` is called once before the first batch and after every batch.
    """
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0")
    if rate is not None and rate <= 0:
        raise ValueError("rate must be > 0")
    stop = stop or threading.Event()
    sleep = sleep or stop.wait
    entries = matching(filters, using=using)
    started = clock()
    if dry_run:
        total = entries[:limit].count() if limit is not None else entries.count()
        return BulkResult(matched=total, dry_run=True, seconds=clock() - started)
    snapshot = entries.values_list("pk", flat=True)
    ids = list(snapshot[:limit] if limit is not None else snapshot)
    result = BulkResult(matched=len(ids))
    if progress:
        progress(0, len(ids))
    per_batch = batch_size_for(rate, batch_size)
    tenant_id = _tenant_id(filters.tenant)
    for chunk in _chunks(ids, per_batch):
        if rate:
            wait = started + result.redriven / rate - clock()
            if wait > 0 and sleep(wait):
                result.interrupted = True
                break
        if stop.is_set():
            result.interrupted = True
            break
        batch = _redrive_batch(chunk, actor, tenant_id, using, None)
        result.redriven += len(batch.redriven)
        result.refused.update(batch.refused.values())
        result.batches += 1
        if progress:
            progress(result.redriven + sum(result.refused.values()), len(ids))
    result.seconds = clock() - started
    logger.info(
        "%s bulk redrive: %d redriven, %d refused, %d batches in %.1fs%s",
        actor, result.redriven, sum(result.refused.values()), result.batches, result.seconds,
        " (interrupted)" if result.interrupted else "",
    )  # fmt: skip
    return result
