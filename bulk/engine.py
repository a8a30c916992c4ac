"""Creating a bulk send's notifications: the handler the scheduler runs for due jobs of kind `bulk_send`.

Each chunk of a started job has one scheduled job, due when the previous chunk is done (the first at
the job's `scheduled_for`). One chunk is one transaction:
  1. its due job, locked FOR UPDATE SKIP LOCKED (queueing.scheduler.due_jobs_sql): one scheduler takes it;
  2. the bulk send's row, locked (a cancel that committed first wins: the chunk creates nothing);
  3. the chunk's rows become notifications through the one creation service (notifications.services:
     providers, templates, preferences and suppressions — a row to an opted-out or suppressed address
     is created `suppressed` —, quiet hours), in one statement whose rows carry the bulk send and row,
     which notification_bulk_row_unique keeps unique;
  4. the job's progress moves on, the chunk's stored rows (its addresses) are dropped, the next chunk's job is added
     due now (behind what is already due: several bulk sends take turns) and this one ends executed.
A scheduler killed anywhere in between rolls the chunk back: its job is pending again and a peer (or
its restart) creates it, once. The notifications are of priority 5 in the `default` queue: the claim's
fairness between tenants, and priority within a tenant, put other tenants' sends and the same
tenant's priority ≥ 7 sends before them.
Through a workflow, step 3 starts one run per row instead (workflows.statements.start_rows: the job's
id as trigger id, the row's subscriber, its columns as data), in one statement whose unique
(trigger_id, subscriber) key is the row's second guard; the runs' steps then go as any run's."""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from bulk.models import MAX_ERRORS, BulkSend, BulkSendChunk, BulkStatus
from bulk.services import JOB_KIND
from notifications import services
from notifications.validation import Draft
from queueing import schedule, scheduler
from recipients.services import ensure_subscribers
from workflows import statements
from workflows.engine import JOB_KIND as RUN_KIND

logger = logging.getLogger("omnipost.bulk")

# Chunks created per handler call (each its own transaction): the scheduler's other kinds run between calls.
CHUNKS_PER_CALL = 1


def promote(batch_size: int, using: str) -> scheduler.Promotion:
    """Create the notifications of due chunks (queueing.scheduler.PromotionHandler)."""
    done = scheduler.Promotion(0, 0)
    for _ in range(CHUNKS_PER_CALL):
        if not scheduler.any_due(JOB_KIND, using=using):  # one statement when none is due (the usual case)
            break
        step = run_chunk(using=using)
        done = done.plus(step)
        if not step.claimed:
            break
    return done


def run_chunk(*, using: str = "default") -> scheduler.Promotion:
    """One due chunk's notifications, in one transaction (see the module's docstring)."""
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute(scheduler.due_jobs_sql(JOB_KIND), {"n": 1})
            due = cursor.fetchone()
        if due is None:
            return scheduler.Promotion(0, 0)
        job_id, chunk_id, run_at = due
        chunk = BulkSendChunk.objects.using(using).filter(pk=chunk_id).first()
        bulk = None
        if chunk is not None:
            bulk = (BulkSend.objects.using(using).select_for_update(of=("self",))
                    .select_related("tenant", "template", "workflow")
                    .filter(pk=chunk.bulk_send_id).first())  # fmt: skip
        if chunk is None or bulk is None or bulk.status != BulkStatus.SENDING or bulk.rows_done >= chunk.first_row:
            schedule.settle_jobs([], [job_id], using=using)  # cancelled meanwhile: nothing more is created
            return scheduler.Promotion(0, 1)
        # its own Tenant instance: a test key's job makes test notifications (and test runs)
        bulk.tenant.test_mode = bulk.test
        rows = chunk.payload
        created = _start_runs(bulk, rows) if bulk.workflow_id else _create(bulk, chunk.first_row, rows)
        bulk.rows_done = chunk.first_row + len(rows) - 1
        following = (BulkSendChunk.objects.using(using).filter(bulk_send=bulk, first_row=bulk.rows_done + 1)
                     .values_list("id", flat=True).first())  # fmt: skip
        fields = ["rows_done", "skipped", "errors", "error_count"]
        if following is not None:
            schedule.add_timed_jobs(bulk.tenant_id, JOB_KIND, [(following, None, 0.0)], using=using)
        else:
            bulk.status, bulk.completed_at = BulkStatus.COMPLETED, timezone.now()
            fields += ["status", "completed_at"]
        bulk.save(update_fields=fields)
        chunk.payload = None  # the addresses live in the notifications now (encrypted)
        chunk.save(update_fields=["payload"])
        schedule.settle_jobs([job_id], [], using=using)
    logger.info("bulk send %s: rows %d-%d, %d %s", bulk.pk, chunk.first_row, bulk.rows_done, created,
                "runs" if bulk.workflow_id else "notifications")
    return scheduler.Promotion(1, 0, max_lag=(timezone.now() - run_at).total_seconds())


# Tries a row gets within its chunk before it is skipped: a render can miss its deadline on a busy
# machine (templating.renderer's budget), which the next try does not.
ROW_TRIES = 3


def _create(bulk: BulkSend, first_row: int, rows: list[list[Any]]) -> int:
    """The notifications of `rows` (row numbers from `first_row`), in one statement. A row the creation
    service refuses is tried again after the others, up to ROW_TRIES rounds, then counted `skipped` with
    its error (its subscriber lost its address since the upload, say)."""
    by_subscriber = bulk.addressed_by == "subscriber"
    pending = {
        first_row + i: Draft(
            channel=bulk.channel,
            recipient="" if by_subscriber else address,
            subscriber=address if by_subscriber else None,
            template=bulk.template.key,
            context=context,
        )  # fmt: skip
        for i, (address, context) in enumerate(rows)
    }
    specs: dict[int, services.NotificationSpec] = {}
    retry: dict[int, Draft] = {}
    round_no = 1
    while pending:
        numbers = list(pending)
        try:
            built = services.build_specs(bulk.tenant, list(pending.values()), cached=False)
        except services.SpecErrors as exc:
            for index, problems in exc.errors.items():
                row = numbers[index]
                if round_no < ROW_TRIES:
                    retry[row] = pending[row]
                else:
                    _skip(bulk, row, problems)
                del pending[row]
            continue  # the rest again, without them
        specs.update(zip(numbers, built, strict=True))
        pending, retry, round_no = retry, {}, round_no + 1
    numbers = sorted(specs)
    for row in numbers:
        specs[row].bulk_send_id, specs[row].bulk_row = bulk.pk, row
    services.create_notifications(bulk.tenant, [specs[row] for row in numbers], actor=f"bulk_send:{bulk.pk}")
    return len(numbers)


def _start_runs(bulk: BulkSend, rows: list[list[Any]]) -> int:
    """Through a workflow: each row one run of the job's trigger id (the job's id) for its subscriber,
    with the row's columns as its data; subscribers met for the first time are created (no addresses).
    The unique (trigger_id, subscriber) adds nothing for a row whose run exists already."""
    ensure_subscribers(bulk.tenant, [subscriber for subscriber, _ in rows])
    statements.start_rows(bulk.tenant_id, bulk.workflow, bulk.pk, [(subscriber, data) for subscriber, data in rows],
                          actor=None, job_kind=RUN_KIND, test=bulk.test)  # fmt: skip
    return len(rows)


def _skip(bulk: BulkSend, row: int, problems: dict[str, list[str]]) -> None:
    bulk.skipped += 1
    bulk.error_count += 1
    if len(bulk.errors) < MAX_ERRORS:
        field, messages = next(iter(problems.items()))
        column = bulk.addressed_by if field in ("recipient", "subscriber") else None
        bulk.errors.append({"row": row, "column": column, "message": f"{field}: {messages[0]}"})
