"""Due scheduled notifications move `scheduled → queued`: the handler the scheduler runs for each batch
(registered from NotificationsConfig.ready; queueing knows a job only by its `notification_id`).

ONE statement per batch, composed of queueing's fragments for `scheduled_jobs` and `queue_state`
(queueing.scheduler, queueing.schedule, queue.insert_items_sql) and this app's own for `notifications`
(notifications.statements):
  due     - the oldest due jobs, locked (SKIP LOCKED: a peer's are left to it).
  held    - their notifications, locked; one a cancel is changing is skipped, and its job stays pending
            for the next batch. Under the lock the status is current, so a cancel that committed first
            wins.
  decided - a job is live when its notification is still `scheduled`; a job whose notification is gone
            (deleted without its job: no foreign key keeps them together) is settled too, cancelled,
            rather than left due for ever.
  queued  - the live ones' notifications move to `queued`.
  jobs    - executed when live, else cancelled.
  items   - the queue items of the queued notifications, in run_at order; then the batch's figures
            and the dispatchers' doorbell (queueing.scheduler.promotion_result_sql).
"""

from __future__ import annotations

from notifications import statements
from queueing import schedule, scheduler
from queueing.queue import insert_items_sql

_ITEMS = insert_items_sql(
    """(SELECT q.queue AS queue_name, q.priority, jsonb_build_object('channel', q.channel) AS payload,
               0::float8 AS delay, q.tenant_id, q.id AS notification_id, q.provider_id, q.run_at
        FROM queued q) s""",
    order_by="s.run_at",
)
PROMOTE = f"""
WITH due AS (
    {scheduler.due_jobs_sql()}
), held AS (
    SELECT n.id, n.status = 'scheduled' AS live
    FROM notifications n
    WHERE n.id = ANY(ARRAY(SELECT notification_id FROM due))
    FOR UPDATE OF n SKIP LOCKED
), decided AS (
    SELECT due.job_id, due.notification_id, due.run_at, coalesce(held.live, false) AS live
    FROM due LEFT JOIN held ON held.id = due.notification_id
    WHERE held.id IS NOT NULL OR NOT EXISTS (SELECT 1 FROM notifications g WHERE g.id = due.notification_id)
), queued AS (
{statements.queue_due_sql("decided")}
), jobs AS (
    {schedule.settle_jobs_sql("decided")}
), items AS ({_ITEMS}
    RETURNING queue_name
), {scheduler.promotion_result_sql("jobs", "items")}
"""  # noqa: S608 - constant fragments only; values are bound parameters


def promote(batch_size: int, using: str) -> scheduler.Promotion:
    """Promote up to `batch_size` due jobs (queueing.scheduler.PromotionHandler)."""
    return scheduler.run_promotion(PROMOTE, batch_size, using=using)
