"""Drip sequences (`sequences/{key}`): workflows of send and delay steps to one recipient.

A sequence is a workflow of kind `sequence`: its steps `{offset_seconds, channel, template}` are
stored as send steps with a delay step of the offsets' difference between them. An enrollment is a
run of it, to the enrollment's recipient (encrypted, masked beside), with `context` as its data.
Such a run has no condition to wait on, so it is planned at its start: every send step's
notification is created at once, through the one creation service's batch path, scheduled at
starts_at + the delays before it (queued at once when already due), and the run's steps record each
one. Removing the enrollment cancels the run and every step not yet sent.

- `create_sequence()` checks each step's template against the tenant's templates (one query) and
  stores the sequence (one INSERT);
- `enroll()` renders every step with the enrollment's context and stores the run and its
  notifications in one transaction, with a fixed number of statements whatever the step count;
- `unenroll()` cancels the steps not yet sent with a fixed number of batched statements, locking
  scheduled_jobs, then queue_state, then notifications. A step a dispatcher has already leased
  (`dispatching`) finishes; delivered steps stay delivered.

One recipient per enrollment: every step of a sequence must take the same recipient format
(email; sms; or a push/webhook token), which `check_step_channels()` enforces at definition time.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.utils import timezone
from rest_framework.exceptions import NotFound, ValidationError

from core.api.errors import Conflict
from core.ids import uuid7
from core.models import AuditEvent, Tenant, mode_of
from core.validation import check_recipient
from notifications import services
from notifications.models import CANCELLABLE, Notification, Status
from notifications.validation import Draft
from queueing import queue
from queueing.models import ScheduledJob
from templating.models import Template
from workflows.models import RunStatus, StepStatus, Workflow, WorkflowKind, WorkflowRun

logger = logging.getLogger(__name__)

MAX_STEPS = 50
# Which channels can share one recipient value: email addresses, E.164 numbers, opaque tokens/URLs.
RECIPIENT_FORMAT = {"email": "email", "sms": "sms", "push": "token", "webhook": "token"}


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One step as the client defines it; its position is its index in the list."""

    offset_seconds: int
    channel: str
    template: str  # key of a tenant template of the same channel


def step_errors(errors: dict[int, dict[str, list[str]]]) -> ValidationError:
    """`{"steps": {"<index>": {field: [messages]}}}`, the batch error shape."""
    return ValidationError({"steps": {str(i): errors[i] for i in sorted(errors)}})


def check_step_channels(steps: Seq[StepSpec]) -> dict[int, dict[str, list[str]]]:
    """Per-index errors for steps whose recipient format differs from step 0's, or whose offset
    is smaller than the previous step's (steps run in the order given)."""
    errors: dict[int, dict[str, list[str]]] = {}
    if not steps:
        return errors
    first = steps[0]
    for index, step in enumerate(steps[1:], start=1):
        if RECIPIENT_FORMAT[step.channel] != RECIPIENT_FORMAT[first.channel]:
            errors.setdefault(index, {})["channel"] = [
                f"every step must take the same recipient as step 0 ({first.channel}); {step.channel!r} takes "
                "another format. Define one sequence per recipient format (email; sms; push/webhook)."
            ]
        if step.offset_seconds < steps[index - 1].offset_seconds:
            errors.setdefault(index, {})["offset_seconds"] = [
                f"must be at least the previous step's ({steps[index - 1].offset_seconds}): steps run in order"
            ]
    return errors


# --- the workflow a sequence is -------------------------------------------------------------------


def workflow_steps(steps: Seq[StepSpec]) -> list[dict[str, Any]]:
    """A sequence's steps as a workflow's: a send each, after a delay of its offset's growth."""
    out: list[dict[str, Any]] = []
    previous = 0
    for index, step in enumerate(steps):
        if step.offset_seconds > previous:
            out.append({"name": f"wait-{index}", "type": "delay", "seconds": step.offset_seconds - previous})
        out.append({"name": f"step-{index}", "type": "send", "channel": step.channel, "template": step.template})
        previous = step.offset_seconds
    return out


@dataclass(frozen=True, slots=True)
class PlannedStep:
    position: int  # the step's index among the sequence's steps (its send steps)
    index: int  # its index in the workflow's steps
    offset_seconds: int
    step: dict[str, Any]


def planned(steps: Iterable[dict[str, Any]]) -> list[PlannedStep]:
    """The send steps of a sequence's workflow, each with the sum of the delays before it."""
    out: list[PlannedStep] = []
    offset = 0
    for index, step in enumerate(steps):
        if step["type"] == "delay":
            offset += int(step["seconds"])
        elif step["type"] == "send":
            out.append(PlannedStep(len(out), index, offset, step))
    return out


# --- reading --------------------------------------------------------------------------------------


def sequences_for(tenant: Tenant) -> QuerySet[Workflow]:
    """The tenant's sequences (their steps are in the row: one query for any page)."""
    return Workflow.objects.for_tenant(tenant).filter(kind=WorkflowKind.SEQUENCE)


def enrollments_for(tenant: Tenant, sequence_key: str) -> QuerySet[WorkflowRun]:
    """A sequence's enrollments (the runs of its workflow); `with_step_notifications` adds their steps."""
    return (
        WorkflowRun.objects.for_tenant(tenant)
        .filter(workflow__kind=WorkflowKind.SEQUENCE, workflow__key=sequence_key)
        .select_related("workflow")
    )


def with_step_notifications(tenant: Tenant, runs: Seq[WorkflowRun]) -> Seq[WorkflowRun]:
    """Each run gets `step_notifications`, its steps' notifications in step order (one query for all)."""
    ids = [state["notification_id"] for run in runs for state in run.steps if state.get("notification_id")]
    notes = {
        str(n.pk): n
        for n in Notification.objects.for_tenant(tenant)
        .filter(pk__in=ids)
        .only("id", "channel", "status", "scheduled_for", "metadata")
        .with_live_status()
    }  # fmt: skip
    for run in runs:
        run.step_notifications = [  # type: ignore[attr-defined]
            notes[state["notification_id"]] for state in run.steps if state.get("notification_id") in notes
        ]
    return runs


def get_sequence_id(tenant: Tenant, key: str) -> int:
    pk = sequences_for(tenant).filter(key=key).values_list("pk", flat=True).first()
    if pk is None:
        raise NotFound("No sequence with this key.")
    return pk


def step_position(notification: Notification) -> int:
    return int((notification.metadata or {}).get("step", 0))


def uses_template(template: Template) -> bool:
    """Whether a sequence of the template's tenant sends it (its deletion is refused then)."""
    return (
        sequences_for(template.tenant_id)
        .filter(steps__contains=[{"template": template.key, "channel": template.channel}])
        .exists()
    )


# --- defining -------------------------------------------------------------------------------------


def create_sequence(tenant: Tenant, key: str, name: str, steps: Seq[StepSpec], *, actor: str) -> Workflow:
    """Store a sequence (a workflow of its kind). 400 naming the step index for an unknown template
    or one of another channel; 409 when the key is taken."""
    errors = check_step_channels(steps)
    templates = dict(
        Template.objects.for_tenant(tenant).filter(key__in={s.template for s in steps}).values_list("key", "channel")
    )
    for index, step in enumerate(steps):
        channel = templates.get(step.template)
        if channel is None:
            errors.setdefault(index, {})["template"] = [
                f"no template with key {step.template!r}; create it first (POST templates)"
            ]
        elif channel != step.channel:
            errors.setdefault(index, {})["template"] = [
                f"template {step.template!r} is for channel {channel!r}, not {step.channel!r}"
            ]
    if errors:
        raise step_errors(errors)
    sequence = Workflow(tenant=tenant, kind=WorkflowKind.SEQUENCE, key=key, name=name, steps=workflow_steps(steps))
    try:
        with transaction.atomic():
            sequence.save(force_insert=True)
            AuditEvent.record(actor=actor, action="sequence.created", target=sequence,
                              details={"key": key, "steps": len(steps)})  # fmt: skip
    except IntegrityError:
        raise Conflict(f"A sequence with key {key!r} already exists.", code="already_exists") from None
    logger.info("%s created sequence %s with %d step(s)", actor, sequence.pk, len(steps))
    return sequence


# --- enrolling ------------------------------------------------------------------------------------


def enroll(
    tenant: Tenant,
    sequence_key: str,
    *,
    recipient: str,
    context: dict[str, Any],
    starts_at: datetime | None = None,
    provider: str | dict[str, str] | None = None,
    actor: str,
) -> WorkflowRun:
    """Enroll one recipient: a run of the sequence's workflow, planned at once: one notification per
    step, scheduled at starts_at + offset (or queued at once when already due), each rendered now from
    its template and `context`.

    `provider` is a provider name for every step, or `{channel: name}`; a channel it does not name
    uses the tenant's default provider for that channel. 404 for an unknown key; 400 when the
    recipient does not suit a step's channel, a provider is missing or a template fails to render.
    Statements, whatever the step count: one SELECT of the sequence, three from build_specs
    (providers, templates, categories), then in one transaction the creation statement of the
    notifications (with their scheduled jobs and queue items), the run's INSERT and the audit event.
    """
    sequence = sequences_for(tenant).filter(key=sequence_key).first()
    if sequence is None:
        raise NotFound("No sequence with this key.")
    sends = planned(sequence.steps)
    for channel in dict.fromkeys(send.step["channel"] for send in sends):
        try:
            check_recipient(recipient, channel)
        except ValueError as exc:
            raise ValidationError({"recipient": [f"{exc} (the sequence sends on {channel})"]}) from None

    run_id = uuid7()
    start = starts_at or timezone.now()
    definition = [dict(step) for step in sequence.steps]
    for send in sends:
        if name := _provider_name(provider, send.step["channel"]):
            definition[send.index]["provider"] = name
    drafts = [
        Draft(
            channel=send.step["channel"], recipient=recipient, provider=definition[send.index].get("provider"),
            template=send.step["template"], context=context,
            scheduled_for=start + timedelta(seconds=send.offset_seconds),
            metadata={"sequence": sequence.key, "enrollment_id": str(run_id), "step": send.position},
        )  # fmt: skip
        for send in sends
    ]
    try:
        specs = services.build_specs(tenant, drafts, cached=False)  # in our own transaction: no version check
    except services.SpecErrors as exc:
        raise step_errors(exc.errors) from None

    with transaction.atomic():
        rows = services.create_notifications(tenant, specs, actor=actor)
        states = _states(definition, start, {send.index: row for send, row in zip(sends, rows, strict=True)})
        now = timezone.now()
        run = WorkflowRun(
            id=run_id, tenant=tenant, workflow=sequence, subscriber="", trigger_id=run_id,
            status=RunStatus.COMPLETED, data=context, definition=definition, category=sequence.category,
            step_index=max(len(states) - 1, 0), steps=states, recipient=recipient,
            recipient_masked=services._masked(sends[0].step["channel"], recipient), starts_at=start,
            created_at=now, updated_at=now, test=mode_of(tenant),
        )  # fmt: skip
        run.save(force_insert=True)
        AuditEvent.record(
            actor=actor, action="sequence.enrolled", target=run,
            details={"sequence": sequence.key, "recipient_masked": run.recipient_masked,
                     "notification_ids": [str(n.id) for n in rows]},
        )  # fmt: skip
    run.step_notifications = rows  # type: ignore[attr-defined]
    logger.info("%s enrolled %s in sequence %s (%d steps)", actor, run.pk, sequence.pk, len(rows))
    return run


def _states(definition: list[dict[str, Any]], start: datetime, rows: dict[int, Notification]) -> list[dict[str, Any]]:
    """The planned run's steps: every send done with its notification, at its time; every delay done."""
    states: list[dict[str, Any]] = []
    offset = 0
    for index, step in enumerate(definition):
        if step["type"] == "delay":
            offset += int(step["seconds"])
        row = rows.get(index)
        states.append({"name": step["name"], "type": step["type"], "status": StepStatus.DONE,
                       "notification_id": str(row.pk) if row else None,
                       "at": (start + timedelta(seconds=offset)).isoformat(), "reason": None})  # fmt: skip
    return states


def _provider_name(provider: str | dict[str, str] | None, channel: str) -> str | None:
    if isinstance(provider, dict):
        return provider.get(channel)
    return provider


# --- unenrolling ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unenrolled:
    steps_cancelled: int
    jobs_cancelled: int


def unenroll(tenant: Tenant, sequence_key: str, enrollment_id: uuid.UUID | str, *, actor: str) -> Unenrolled:
    """The run → cancelled, and every step not yet sent (scheduled/queued/retrying) → cancelled with
    its pending job cancelled and its queue item deleted. A step being dispatched (its item leased)
    finishes; delivered steps stay.
    404 for an unknown or another tenant's enrollment, 409 when already cancelled."""
    runs = enrollments_for(tenant, sequence_key).filter(pk=enrollment_id)
    with transaction.atomic():
        current = runs.select_for_update(of=("self",)).values_list("status", "steps").first()
        if current is None:
            raise NotFound("No enrollment with this id in this sequence.")
        status, states = current
        if status == RunStatus.CANCELLED:
            raise Conflict("The enrollment is already cancelled.", code="already_cancelled")
        runs.update(status=RunStatus.CANCELLED, wake_id=None, updated_at=Now())
        ids = [state["notification_id"] for state in states if state.get("notification_id")]
        steps = Notification.objects.for_tenant(tenant).filter(pk__in=ids)
        # Lock order: scheduled_jobs (shared with the scheduler), then queue_state → notifications
        # (shared with the dispatcher's record statement). A step whose item is leased is being
        # sent right now: it finishes, and its outcome is recorded.
        jobs_cancelled = (
            ScheduledJob.objects.for_tenant(tenant)
            .filter(status=ScheduledJob.Status.PENDING, notification_id__in=ids)
            .update(status=ScheduledJob.Status.CANCELLED)
        )
        leases = queue.lock_for(ids, tenant_id=tenant.pk)
        sending = [nid for nid, leased in leases.items() if leased]
        cancellable = steps.filter(status__in=CANCELLABLE).exclude(pk__in=sending)
        steps_cancelled = cancellable.update(status=Status.CANCELLED, updated_at=Now())
        queue.remove_for(steps.filter(status=Status.CANCELLED).values("id"), tenant_id=tenant.pk)
        AuditEvent.record(
            actor=actor, action="sequence.unenrolled", target_type=WorkflowRun._meta.label_lower,
            target_id=enrollment_id, tenant=tenant,
            details={"sequence": sequence_key, "steps_cancelled": steps_cancelled, "jobs_cancelled": jobs_cancelled},
        )  # fmt: skip
    logger.info("%s unenrolled %s: %d step(s) cancelled", actor, enrollment_id, steps_cancelled)
    return Unenrolled(steps_cancelled=steps_cancelled, jobs_cancelled=jobs_cancelled)
