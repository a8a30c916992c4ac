"""Drip sequences: define steps, enroll a recipient (every step scheduled at once), unenroll.

- `create_sequence()` checks each step's template against the tenant's templates (one query) and
  stores the sequence and its steps (one INSERT each);
- `enroll()` renders every step with the enrollment's context and creates one notification per
  step through `services.create_notifications()` (run_at = starts_at + offset; a step already due is
  queued at once), in one transaction with a fixed number of statements whatever the step count;
- `unenroll()` cancels the steps not yet sent with a fixed number of batched statements, locking
  scheduled_jobs, then queue_state, then notifications. A step a dispatcher has already leased
  (`dispatching`) finishes; delivered steps stay delivered.

One recipient per enrollment: every step of a sequence must take the same recipient format
(email; sms; or a push/webhook token), which `check_step_channels()` enforces at definition time.
A journey across email and SMS is two sequences, one enrollment in each.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Prefetch, QuerySet
from django.db.models.functions import Now
from django.utils import timezone
from rest_framework.exceptions import NotFound, ValidationError

from core.api.errors import Conflict
from core.models import AuditEvent, Tenant
from core.validation import check_recipient
from notifications import services
from notifications.models import CANCELLABLE, Enrollment, Notification, Sequence, SequenceStep, Status
from notifications.validation import Draft
from queueing import queue
from queueing.models import ScheduledJob
from templating.models import Template

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


# --- reading --------------------------------------------------------------------------------------


def sequences_for(tenant: Tenant) -> QuerySet[Sequence]:
    """The tenant's sequences with their steps and templates (two queries for any page)."""
    steps = SequenceStep.objects.for_tenant(tenant).select_related("template").order_by("position")
    return Sequence.objects.for_tenant(tenant).prefetch_related(Prefetch("steps", queryset=steps))


def enrollments_for(tenant: Tenant, sequence_key: str) -> QuerySet[Enrollment]:
    """A sequence's enrollments, each with `step_notifications` (its notifications in step order)."""
    notes = (
        Notification.objects.for_tenant(tenant)
        .only("id", "channel", "status", "scheduled_for", "metadata", "enrollment_id")
        .with_live_status()
    )
    return (
        Enrollment.objects.for_tenant(tenant)
        .filter(sequence__key=sequence_key)
        .select_related("sequence")
        .prefetch_related(Prefetch("notifications", queryset=notes, to_attr="step_notifications"))
    )


def get_sequence_id(tenant: Tenant, key: str) -> int:
    pk = Sequence.objects.for_tenant(tenant).filter(key=key).values_list("pk", flat=True).first()
    if pk is None:
        raise NotFound("No sequence with this key.")
    return pk


def step_position(notification: Notification) -> int:
    return int((notification.metadata or {}).get("step", 0))


# --- defining -------------------------------------------------------------------------------------


def create_sequence(tenant: Tenant, key: str, name: str, steps: Seq[StepSpec], *, actor: str) -> Sequence:
    """Store a sequence and its steps. 400 naming the step index for an unknown template or one
    of another channel; 409 when the key is taken."""
    errors = check_step_channels(steps)
    templates = {t.key: t for t in Template.objects.for_tenant(tenant).filter(key__in={s.template for s in steps})}
    for index, step in enumerate(steps):
        template = templates.get(step.template)
        if template is None:
            errors.setdefault(index, {})["template"] = [
                f"no template with key {step.template!r}; create it first (POST templates)"
            ]
        elif template.channel != step.channel:
            errors.setdefault(index, {})["template"] = [
                f"template {template.key!r} is for channel {template.channel!r}, not {step.channel!r}"
            ]
    if errors:
        raise step_errors(errors)
    sequence = Sequence(tenant=tenant, key=key, name=name)
    try:
        with transaction.atomic():
            sequence.save(force_insert=True)
            rows = [
                SequenceStep(tenant=tenant, sequence=sequence, position=index, offset_seconds=step.offset_seconds,
                             channel=step.channel, template=templates[step.template])  # fmt: skip
                for index, step in enumerate(steps)
            ]
            SequenceStep.objects.bulk_create(rows)
            AuditEvent.record(actor=actor, action="sequence.created", target=sequence,
                              details={"key": key, "steps": len(rows)})  # fmt: skip
    except IntegrityError:
        raise Conflict(f"A sequence with key {key!r} already exists.", code="already_exists") from None
    # The response shows the steps: serve them from memory, not another query.
    sequence._prefetched_objects_cache = {"steps": rows}  # type: ignore[attr-defined]
    logger.info("%s created sequence %s with %d step(s)", actor, sequence.pk, len(rows))
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
) -> Enrollment:
    """Enroll one recipient: one notification per step, scheduled at starts_at + offset_seconds
    (or queued at once when already due), each rendered now from its template and `context`.

    `provider` is a provider name for every step, or `{channel: name}`; a channel it does not name
    uses the tenant's default provider for that channel. 404 for an unknown key; 400 when the
    recipient does not suit a step's channel, a provider is missing or a template fails to render.
    Statements, whatever the step count: one SELECT of the steps, three from build_specs (providers,
    templates, categories), then in one transaction the INSERTs of the enrollment, notifications, scheduled jobs
    and/or queue items, and the audit event.
    """
    steps = list(
        SequenceStep.objects.for_tenant(tenant).filter(sequence__key=sequence_key)
        .select_related("sequence", "template").order_by("position")
    )  # fmt: skip
    if not steps:  # a sequence always has at least one step
        raise NotFound("No sequence with this key.")
    sequence = steps[0].sequence
    for channel in dict.fromkeys(step.channel for step in steps):
        try:
            check_recipient(recipient, channel)
        except ValueError as exc:
            raise ValidationError({"recipient": [f"{exc} (the sequence sends on {channel})"]}) from None

    enrollment_id = uuid.uuid4()
    start = starts_at or timezone.now()
    drafts = [
        Draft(
            channel=step.channel, recipient=recipient, provider=_provider_name(provider, step.channel),
            template=step.template.key, context=context,
            scheduled_for=start + timedelta(seconds=step.offset_seconds),
            metadata={"sequence": sequence.key, "enrollment_id": str(enrollment_id), "step": step.position},
        )  # fmt: skip
        for step in steps
    ]
    try:
        specs = services.build_specs(tenant, drafts, cached=False)  # in our own transaction: no version check
    except services.SpecErrors as exc:
        raise step_errors(exc.errors) from None
    for spec in specs:
        spec.enrollment_id = enrollment_id

    enrollment = Enrollment(
        id=enrollment_id, tenant=tenant, sequence=sequence, recipient=recipient,
        recipient_masked=services._masked(steps[0].channel, recipient), context=context, starts_at=start,
    )  # fmt: skip
    with transaction.atomic():
        enrollment.save(force_insert=True)
        rows = services.create_notifications(tenant, specs, actor=actor)
        AuditEvent.record(
            actor=actor, action="sequence.enrolled", target=enrollment,
            details={"sequence": sequence.key, "recipient_masked": enrollment.recipient_masked,
                     "notification_ids": [str(n.id) for n in rows]},
        )  # fmt: skip
    enrollment.step_notifications = rows  # type: ignore[attr-defined]
    logger.info("%s enrolled %s in sequence %s (%d steps)", actor, enrollment.pk, sequence.pk, len(rows))
    return enrollment


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
    """active → cancelled, and every step not yet sent (scheduled/queued/retrying) → cancelled with
    its pending job cancelled and its queue item deleted. A step being dispatched (its item leased)
    finishes; delivered steps stay.
    404 for an unknown or another tenant's enrollment, 409 when already cancelled."""
    enrollments = Enrollment.objects.for_tenant(tenant).filter(pk=enrollment_id, sequence__key=sequence_key)
    steps = Notification.objects.for_tenant(tenant).filter(enrollment_id=enrollment_id)
    with transaction.atomic():
        if not enrollments.filter(state=Enrollment.State.ACTIVE).update(
            state=Enrollment.State.CANCELLED, cancelled_at=Now()
        ):
            current = enrollments.values_list("state", flat=True).first()
            if current is None:
                raise NotFound("No enrollment with this id in this sequence.")
            raise Conflict("The enrollment is already cancelled.", code="already_cancelled")
        # Lock order: scheduled_jobs (shared with the scheduler), then queue_state → notifications
        # (shared with the dispatcher's record statement). A step whose item is leased is being
        # sent right now: it finishes, and its outcome is recorded.
        jobs_cancelled = (
            ScheduledJob.objects.for_tenant(tenant)
            .filter(status=ScheduledJob.Status.PENDING, notification_id__in=steps.values("id"))
            .update(status=ScheduledJob.Status.CANCELLED)
        )
        leases = queue.lock_for(steps.values("id"), tenant_id=tenant.pk)
        sending = [nid for nid, leased in leases.items() if leased]
        cancellable = steps.filter(status__in=CANCELLABLE).exclude(pk__in=sending)
        steps_cancelled = cancellable.update(status=Status.CANCELLED, updated_at=Now())
        queue.remove_for(steps.filter(status=Status.CANCELLED).values("id"), tenant_id=tenant.pk)
        AuditEvent.record(
            actor=actor, action="sequence.unenrolled", target_type=Enrollment._meta.label_lower,
            target_id=enrollment_id, tenant=tenant,
            details={"sequence": sequence_key, "steps_cancelled": steps_cancelled, "jobs_cancelled": jobs_cancelled},
        )  # fmt: skip
    logger.info("%s unenrolled %s: %d step(s) cancelled", actor, enrollment_id, steps_cancelled)
    return Unenrolled(steps_cancelled=steps_cancelled, jobs_cancelled=jobs_cancelled)
