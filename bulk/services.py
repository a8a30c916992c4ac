"""Bulk sends: upload (check every row, store the valid rows encrypted), start, cancel, progress.

The rows become notifications later, a chunk per transaction, through the scheduler (bulk.engine).
Lock order, shared with the engine so they cannot deadlock: scheduled_jobs → bulk_sends."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from rest_framework.exceptions import NotFound, ValidationError

from bulk import csvfile
from bulk.models import MAX_BYTES, BulkSend, BulkSendChunk, BulkStatus
from core.api.errors import Conflict, PayloadTooLarge
from core.channels import CHANNELS
from core.models import AuditEvent, Tenant, mode_of
from notifications.models import Notification
from notifications.validation import check_scheduled_for
from providers.models import Provider
from queueing import schedule
from templating import renderer
from templating.models import Template
from workflows import services as workflows
from workflows.models import Workflow

logger = logging.getLogger("omnipost.bulk")

JOB_KIND = "bulk_send"
MAX_NAME_CHARS = 200


def bulk_sends_for(tenant: Tenant) -> QuerySet[BulkSend]:
    return BulkSend.objects.for_tenant(tenant).select_related("template", "workflow")


def get_bulk_send(tenant: Tenant, bulk_id: Any) -> BulkSend:  # noqa: ANN401
    try:
        bulk_id = uuid.UUID(str(bulk_id))
    except ValueError:
        raise NotFound("No bulk send with this id.") from None
    bulk = bulk_sends_for(tenant).filter(pk=bulk_id).first()
    if bulk is None:
        raise NotFound("No bulk send with this id.")
    return bulk


# --- upload ------------------------------------------------------------------------------------------


def clean_options(tenant: Tenant, data: Any) -> dict[str, Any]:  # noqa: ANN401
    """`channel` and `template`, or `workflow`, `scheduled_for`, `name` of an upload, checked; 400 names
    each bad field."""
    if not isinstance(data, dict):
        raise ValidationError({"non_field_errors": ["the body must be a JSON object or a multipart form"]})
    problems: dict[str, list[str]] = {}
    workflow = None
    if data.get("workflow") not in (None, ""):
        workflow = _clean_workflow(tenant, data, problems)
        channel, template, variables = "", None, set()
    else:
        channel, template, variables = _clean_template(tenant, data, problems)
    scheduled_for = None
    try:
        scheduled_for = check_scheduled_for(data.get("scheduled_for"))
    except ValueError as exc:
        problems["scheduled_for"] = [str(exc)]
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
        problems["name"] = [f"must be a text of at most {MAX_NAME_CHARS} characters"]
    if problems:
        raise ValidationError(problems)
    return {"channel": channel, "template": template, "workflow": workflow, "scheduled_for": scheduled_for,
            "name": name, "variables": variables}  # fmt: skip


def _clean_workflow(tenant: Tenant, data: dict[str, Any], problems: dict[str, list[str]]) -> Workflow | None:
    key = data["workflow"]
    for other in ("template", "channel"):
        if data.get(other) not in (None, ""):
            problems[other] = ["name a `workflow` or a `template` and `channel`, not both: a workflow's steps "
                               "name their channels and templates"]  # fmt: skip
    if not isinstance(key, str):
        problems["workflow"] = ["must be a workflow's key"]
        return None
    workflow = workflows.workflows_of(Workflow.objects.for_tenant(tenant)).filter(key=key).first()
    if workflow is None:
        problems["workflow"] = [f"no workflow with key {key!r}"]
    return workflow


def _clean_template(tenant: Tenant, data: dict[str, Any], problems: dict[str, list[str]]) -> tuple[Any, Any, set[str]]:
    channel = data.get("channel")
    if channel not in CHANNELS:
        problems["channel"] = [f"must be one of {', '.join(CHANNELS)}"]
    key = data.get("template")
    template = None
    if not isinstance(key, str) or not key:
        problems.setdefault("template", ["required (or `workflow`): the key of the template each row is rendered "
                                         "with"])  # fmt: skip
    else:
        template = Template.objects.for_tenant(tenant).filter(key=key).first()
        if template is None:
            problems["template"] = [f"no template with key {key!r}"]
        elif channel in CHANNELS and template.channel != channel:
            problems["template"] = [f"template {key!r} is for channel {template.channel!r}"]
    if channel in CHANNELS and channel != "in_app" and not _has_default_provider(tenant, channel):
        problems["channel"] = [f"no default provider for channel {channel!r}: mark a provider is_default"]
    variables: set[str] = set()
    if template is not None and "template" not in problems:
        try:
            variables = renderer.variables(template.subject) | renderer.variables(template.body)
        except renderer.TemplateError as exc:
            problems["template"] = [f"template {key!r} does not compile: {exc}"]
    return channel, template, variables


def _has_default_provider(tenant: Tenant, channel: str) -> bool:
    return (
        Provider.objects.for_tenant(tenant)
        .filter(Q(is_default=True) | Q(failover_order__isnull=False), channel=channel)
        .exists()
    )


def check_size(size: int) -> None:
    if size > MAX_BYTES:
        raise PayloadTooLarge(f"The file is {size} bytes; a bulk send's file is at most {MAX_BYTES} bytes (20 MiB).")


def create_bulk_send(tenant: Tenant, lines: Iterable[str], options: dict[str, Any], *, actor: str) -> BulkSend:
    """Check every row of the CSV `lines`; store the job (`ready`, with its rows, or `invalid`, with its
    errors). 400 for a header that cannot work, no data rows, or more than MAX_ROWS."""
    with transaction.atomic():
        # The job first (its rows point at it); its status once every row is read.
        bulk = BulkSend.objects.create(
            tenant=tenant, name=options["name"], channel=options["channel"], template=options["template"],
            workflow=options["workflow"], addressed_by="", status=BulkStatus.INVALID,
            scheduled_for=options["scheduled_for"], test=mode_of(tenant),
        )  # fmt: skip

        def store(first_row: int, rows: list[list[Any]]) -> None:
            BulkSendChunk.objects.create(tenant=tenant, bulk_send=bulk, first_row=first_row,
                                         last_row=first_row + len(rows) - 1, payload=rows)  # fmt: skip

        try:
            checked = csvfile.check(lines, tenant_id=tenant.pk, channel=options["channel"],
                                    variables=options["variables"], store=store,
                                    workflow=options["workflow"] is not None)  # fmt: skip
        except UnicodeDecodeError:
            raise ValidationError({"file": ["the file must be UTF-8 text"]}) from None
        except ValueError as exc:
            raise ValidationError({"file": [str(exc)]}) from None
        if checked.rows == 0:
            raise ValidationError({"file": ["the file has a header but no data rows"]})
        if checked.error_count:
            BulkSendChunk.objects.filter(bulk_send=bulk).delete()  # an invalid file is never sent
        bulk.status = BulkStatus.INVALID if checked.error_count else BulkStatus.READY
        bulk.addressed_by, bulk.columns, bulk.rows = checked.addressed_by, checked.columns, checked.rows
        bulk.errors, bulk.error_count = checked.errors, checked.error_count
        bulk.save(update_fields=["status", "addressed_by", "columns", "rows", "errors", "error_count"])
        details = {"rows": checked.rows, "status": bulk.status, "errors": checked.error_count}
        AuditEvent.record(actor=actor, action="bulk_send.created", target=bulk, details=details)
    logger.info("%s uploaded bulk send %s: %d rows, %s (%d errors)", actor, bulk.pk, bulk.rows, bulk.status,
                checked.error_count)  # fmt: skip
    return bulk


# --- start and cancel -----------------------------------------------------------------------------------


def start(tenant: Tenant, bulk_id: Any, *, actor: str) -> BulkSend:  # noqa: ANN401
    """ready → sending: the first chunk's job is due at `scheduled_for` (now without one). 409 otherwise."""
    bulk = get_bulk_send(tenant, bulk_id)
    with transaction.atomic():
        bulk = BulkSend.objects.select_for_update(of=("self",)).select_related("template", "workflow").get(pk=bulk.pk)
        if bulk.status != BulkStatus.READY:
            raise Conflict(f"A bulk send that is {bulk.status} cannot be started; only a ready one can.",
                           code="not_ready")  # fmt: skip
        first = BulkSendChunk.objects.filter(bulk_send=bulk, first_row=1).values_list("id", flat=True).first()
        bulk.status, bulk.started_at = BulkStatus.SENDING, timezone.now()
        bulk.save(update_fields=["status", "started_at"])
        schedule.add_timed_jobs(tenant.pk, JOB_KIND, [(first, bulk.scheduled_for, 0.0)])
        AuditEvent.record(actor=actor, action="bulk_send.started", target=bulk, details={"rows": bulk.rows})
    return bulk


def cancel(tenant: Tenant | None, bulk_id: Any, *, actor: str) -> BulkSend:  # noqa: ANN401
    """ready or sending → cancelled: rows whose notifications do not exist yet never get one (a chunk
    being created now is waited for). `tenant` None: any tenant's (the console checks its own scope)."""
    bulk = get_bulk_send(tenant, bulk_id) if tenant is not None else BulkSend.objects.get(pk=bulk_id)
    with transaction.atomic():
        unsent = BulkSendChunk.objects.filter(bulk_send_id=bulk.pk, payload__isnull=False)
        chunks = list(unsent.values_list("id", flat=True))
        schedule.cancel_jobs_for(JOB_KIND, chunks)  # jobs first: the order the engine locks in
        bulk = BulkSend.objects.select_for_update(of=("self",)).select_related("template", "workflow").get(pk=bulk.pk)
        if bulk.status not in (BulkStatus.READY, BulkStatus.SENDING):
            raise Conflict(f"A bulk send that is {bulk.status} cannot be cancelled.", code="not_cancellable")
        bulk.status, bulk.cancelled_at = BulkStatus.CANCELLED, timezone.now()
        bulk.save(update_fields=["status", "cancelled_at"])
        unsent.delete()  # their addresses are needed no more
        AuditEvent.record(actor=actor, action="bulk_send.cancelled", target=bulk,
                          details={"rows": bulk.rows, "created": bulk.rows_done - bulk.skipped})  # fmt: skip
    return bulk


# --- progress -------------------------------------------------------------------------------------------

# The job's counts: the settled chunks' kept counts, plus one pass over the notifications of the others
# (by notification_bulk_row_unique's row ranges), which settles the chunks whose notifications all finished.
_COUNTS = """
WITH open AS (
    SELECT id, first_row, last_row FROM bulk_send_chunks
    WHERE bulk_send_id = %(bulk)s AND payload IS NULL AND NOT settled
), live AS (
    SELECT o.id, count(*) FILTER (WHERE n.status = 'delivered') AS delivered,
           count(*) FILTER (WHERE n.status IN ('failed', 'dead_lettered', 'cancelled')) AS failed,
           count(*) FILTER (WHERE n.status = 'suppressed') AS suppressed, count(*) AS total
    FROM open o JOIN notifications n
      ON n.tenant_id = %(tenant)s AND n.bulk_send_id = %(bulk)s AND n.bulk_row BETWEEN o.first_row AND o.last_row
    GROUP BY o.id
), settle AS (
    UPDATE bulk_send_chunks c SET settled = true, delivered = l.delivered, failed = l.failed,
                                  suppressed = l.suppressed
    FROM live l WHERE c.id = l.id AND l.delivered + l.failed + l.suppressed = l.total
    RETURNING 1
), kept AS (
    SELECT coalesce(sum(delivered), 0) AS delivered, coalesce(sum(failed), 0) AS failed,
           coalesce(sum(suppressed), 0) AS suppressed
    FROM bulk_send_chunks WHERE bulk_send_id = %(bulk)s AND settled
)
SELECT k.delivered + coalesce((SELECT sum(delivered) FROM live), 0),
       k.failed + coalesce((SELECT sum(failed) FROM live), 0),
       k.suppressed + coalesce((SELECT sum(suppressed) FROM live), 0),
       (SELECT count(*) FROM settle)
FROM kept k"""


# Through a workflow: the job's runs (its id is their trigger id), by status, in one statement.
_RUN_COUNTS = """
SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status IN ('failed', 'cancelled')),
       count(*) FILTER (WHERE status IN ('throttled', 'digested'))
FROM workflow_runs WHERE tenant_id = %(tenant)s AND trigger_id = %(bulk)s"""


def progress(bulk: BulkSend) -> dict[str, int]:
    """{created, delivered, failed, suppressed, pending}: `failed` counts failed, dead-lettered and
    cancelled notifications and the rows that could not become one; `pending` those not finished yet.
    One statement, reading the notifications of the chunks not all finished yet (a chunk's counts are
    kept once its notifications all finished: a redriven dead letter still counts as failed); none once
    the whole job finished.

    Through a workflow the counts are of its runs: `created` the runs, `delivered` those completed,
    `failed` those failed or cancelled, `suppressed` those ended by a throttle or joined into another
    run's digest, `pending` those running or waiting (a run's notifications are the run's own)."""
    created = bulk.rows_done - bulk.skipped
    counts = bulk.final_counts
    if counts is None:
        if created == 0:
            counts = {"delivered": 0, "failed": 0, "suppressed": 0}
        else:
            with connections[Notification.objects.db].cursor() as cursor:
                sql = _RUN_COUNTS if bulk.workflow_id else _COUNTS
                cursor.execute(sql, {"bulk": bulk.pk, "tenant": bulk.tenant_id})
                delivered, failed, suppressed = cursor.fetchone()[:3]
            counts = {"delivered": int(delivered), "failed": int(failed), "suppressed": int(suppressed)}
            finished = sum(counts.values())
            if bulk.status == BulkStatus.COMPLETED and finished == created:
                BulkSend.objects.filter(pk=bulk.pk, final_counts__isnull=True).update(final_counts=counts)
                bulk.final_counts = counts
    finished = counts["delivered"] + counts["failed"] + counts["suppressed"]
    return {"created": created, "delivered": counts["delivered"], "failed": counts["failed"] + bulk.skipped,
            "suppressed": counts["suppressed"], "pending": max(0, created - finished)}  # fmt: skip


def notifications_of(bulk: BulkSend) -> QuerySet[Notification]:
    """The job's notifications (tenant-scoped, by row), for the API's list."""
    return (
        Notification.objects.for_tenant(bulk.tenant_id)
        .filter(bulk_send_id=bulk.pk)
        .select_related("provider", "template")
        .with_live_status()
    )
