"""Channel fallback: when a notification does not get through, one linked
notification on the next channel.

A notification created with `fallback: [{"channel", "after_seconds"}]` (to a subscriber) is stored
together with its fallback, in the create's one statement (notifications.services): the fallback
is an ordinary notification on the next channel — the subscriber's address for it, the same
subject, body, template and context, the channel's first provider in failover order — that carries
`fallback_of`, while the original carries `fallback_notification_id`. It waits `scheduled` with no
scheduled job: nothing is due until the original's fate says when.

When it is due and when it is cancelled is routing.fallback's table of decisions:

- The provider accepts the original (the dispatcher's record statement): the fallback's job is due
  `after_seconds` later (`run_at = delivered_at + after_seconds`, on the database's clock).
- The original ends `failed` or `dead_lettered` (the record statement), or a `bounced`, `undelivered`
  or `failed` receipt arrives (the receipts statement): its job is due now.
- A `delivered` (or `complained`) receipt cancels the fallback while it is still `scheduled` (and its
  pending job), and also once promoted, `queued` or `retrying`, as long as no dispatcher holds its
  lease (its queue item is deleted): never both channels when a receipt says the first one got
  through, unless the second is already being sent.
- The original is suppressed (at creation or dispatch) or cancelled: the fallback is cancelled too.

This module writes what they decide: the fallback's row and its job.

Every change is a CTE of the statement that learns the reason (`record_ctes`, `receipt_ctes`), so it
costs no statement of its own, and a job is one row per notification (scheduled_jobs' unique
notification_id): a pending job keeps the earliest run_at any reason gave it (queueing.schedule.
upsert_jobs_sql), an executed or cancelled one never changes. The scheduler's due jobs then promote
the fallback like any scheduled notification, under its lock on the fallback row, so a cancel and a
promotion that race settle on one of the two.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db.models.functions import Now

from notifications import statements
from notifications.models import Notification, Status
from queueing import queue
from queueing.models import ScheduledJob
from queueing.schedule import cancel_pending_jobs_sql, ring_sql, upsert_jobs_sql
from routing.fallback import ON_OUTCOME, ON_RECEIPT, Decision, decision_sql

# The columns a statement's `changed` CTE returns for these fragments (besides tenant_id):
RETURNING = "n.fallback_notification_id AS fallback_id, (n.fallback -> 0 ->> 'after_seconds')::float8 AS fallback_after"


def _ctes(due: str, *, unqueue: bool = False) -> str:
    """The shared part: `fb_due` (notification_id, tenant_id, run_at, cancel) is given; jobs are
    upserted for the fallbacks still `scheduled`, the rows cancelled or given their due time
    (`scheduled_for`, what the detail and the latency histogram read), the schedulers rung.
    `unqueue`: a cancel also takes a promoted fallback out of the queue unless it is leased (only
    a receipt can come after the promotion: the dispatcher's record statement leaves it out)."""
    unqueued = queue.remove_idle_sql(
        """(SELECT d.notification_id FROM fb_due d JOIN notifications f ON f.id = d.notification_id
            WHERE d.cancel AND f.status IN ('queued', 'retrying')) s"""
    ) if unqueue else "SELECT NULL::uuid AS notification_id WHERE false"
    jobs = upsert_jobs_sql(
        """(SELECT gen_random_uuid() AS job_id, d.tenant_id, d.notification_id, d.run_at, now() AS created_at
            FROM fb_due d JOIN notifications f ON f.id = d.notification_id AND f.status = 'scheduled'
            WHERE NOT d.cancel) s"""
    )
    return f"""fb_due AS ({due}
    ), fb_jobs AS ({jobs}
    ), fb_dropped AS (
        {cancel_pending_jobs_sql("fb_due", "d.cancel")}
    ), fb_unqueued AS (
        -- a promoted fallback that no dispatcher holds (a claim in flight is waited for, then seen as
        -- a lease and left alone) leaves the queue
        {unqueued}
    ), fb_rows AS (
        {statements.settle_fallbacks_sql("fb_due", "fb_jobs", "fb_unqueued")}
    ), fb_ring AS (
        SELECT {ring_sql("run_at")} FROM fb_jobs HAVING count(*) > 0
    )"""  # noqa: S608 - fixed fragments


def _due(changed: str, table: dict[str, Decision], column: str) -> str:
    """`fb_due` from `changed`: each fallback whose original's `column` decides something by `table`
    (routing.fallback), with its due time or its cancel."""
    decided, cancels, delay = decision_sql(table, f"c.{column}", "c.fallback_after")
    return f"""
        SELECT DISTINCT ON (c.fallback_id) c.fallback_id AS notification_id, c.tenant_id,
               now() + make_interval(secs => {delay}) AS run_at, {cancels} AS cancel
        FROM {changed} c
        WHERE c.fallback_id IS NOT NULL AND {decided}"""  # noqa: S608 - fixed fragments


def record_ctes(changed: str) -> str:
    """CTEs for the dispatcher's record statement (dispatch.delivery), after `changed` (the updated
    notifications, returning `status`, `tenant_id` and RETURNING's columns). The statement must read
    `fb_ring` (e.g. `(SELECT count(*) FROM fb_ring)`) for the doorbell to ring."""
    return _ctes(_due(changed, ON_OUTCOME, "status"))


def receipt_ctes(changed: str) -> str:
    """CTEs for the receipts statement (receipts.services), after `changed` (notifications whose
    receipt changed, returning `receipt`, `tenant_id` and RETURNING's columns)."""
    return _ctes(_due(changed, ON_RECEIPT, "receipt"), unqueue=True)


def cancel_with(tenant_id: Any, notification_ids: Sequence[uuid.UUID | str], *, using: str = "default") -> int:  # noqa: ANN401
    """The fallbacks still `scheduled` of notifications being cancelled are cancelled too, with their
    pending jobs (in the caller's transaction, after the notifications' own cancel). Two statements."""
    originals = Notification.objects.using(using).filter(tenant_id=tenant_id, pk__in=list(notification_ids))
    fallbacks = Notification.objects.using(using).filter(
        tenant_id=tenant_id, status=Status.SCHEDULED,
        pk__in=originals.filter(fallback_notification_id__isnull=False).values("fallback_notification_id"),
    )  # fmt: skip
    ScheduledJob.objects.using(using).filter(
        tenant_id=tenant_id, status=ScheduledJob.Status.PENDING, notification_id__in=fallbacks.values("pk")
    ).update(status=ScheduledJob.Status.CANCELLED)
    return fallbacks.update(status=Status.CANCELLED, updated_at=Now())
