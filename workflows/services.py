"""Workflows every door uses (the API, the admin): define them, trigger runs, cancel runs.

- `save_workflow()` checks what the steps name (templates, providers, the category) against the
  tenant's configuration, one query each;
- `trigger()` creates the subscribers it meets for the first time (no addresses), one run per
  subscriber and a job due now for each, in a fixed number of statements whatever their count; the
  scheduler then advances the runs (workflows.engine);
- `cancel()` stops the unfinished runs with a cancellation key before their next step, in chunks of a
  fixed number of set-based statements, locking their jobs first (the order the scheduler takes them),
  and cancels the notifications they scheduled; named subscribers a running fan-out has not reached
  yet get their runs `cancelled` when it does;
- `cancel_fanout()` stops a topic fan-out before its next chunk (the admin's action).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import ProtectedError, QuerySet
from django.db.models.functions import Now
from rest_framework.exceptions import NotFound, ValidationError

from core.api.errors import Conflict
from core.models import AuditEvent, Tenant, mode_of
from core.services import save_audited
from core.validation import NAME
from notifications import services as notifications
from providers.models import Provider
from queueing import schedule
from recipients import services as recipients
from recipients import topics
from templating import renderer
from templating.models import Template
from workflows import statements
from workflows.engine import JOB_KIND, SHARE_KIND
from workflows.fanout import JOB_KIND as FANOUT_KIND
from workflows.models import Fanout, Workflow, WorkflowKind, WorkflowRun

logger = logging.getLogger(__name__)

MAX_SUBSCRIBERS = 1000
MAX_DATA_BYTES = 32 * 1024


def workflows_of(workflows: QuerySet[Workflow]) -> QuerySet[Workflow]:
    """The workflows among `workflows` (a sequence is one too, of its own kind, under `sequences/`)."""
    return workflows.filter(kind=WorkflowKind.WORKFLOW)


def get_workflow(tenant: Tenant, key: str) -> Workflow:
    workflow = workflows_of(Workflow.objects.for_tenant(tenant)).filter(key=key).first()
    if workflow is None:
        raise NotFound("No workflow with this key.")
    return workflow


def check_references(tenant: Tenant, category: str, steps: Sequence[dict[str, Any]]) -> None:
    """400 for a category, template or provider the tenant does not have (or of another channel)."""
    errors: dict[str, Any] = {}
    if category not in recipients.fresh_category_keys(tenant, {category}):
        errors["category"] = [f"no category with key {category!r}: create it first (POST categories)"]
    sends = [(i, s) for i, s in enumerate(steps) if s.get("type") == "send"]
    keys = {s["template"] for _, s in sends if s.get("template")}
    names = {s["provider"] for _, s in sends if s.get("provider")}
    templates = dict(Template.objects.for_tenant(tenant).filter(key__in=keys).values_list("key", "channel"))
    providers = dict(Provider.objects.for_tenant(tenant).filter(name__in=names).values_list("name", "channel"))
    problems: dict[str, dict[str, list[str]]] = {}
    for index, step in sends:
        for field in ("subject", "body"):
            if step.get(field) and not step.get("template"):
                try:
                    renderer.check(step[field])
                except renderer.TemplateError as exc:
                    problems.setdefault(str(index), {})[field] = [f"invalid template: {exc}"]
        checks = (("template", templates, "template with key"), ("provider", providers, "provider named"))
        for field, known, what in checks:
            name = step.get(field)
            if not name:
                continue
            if name not in known:
                problems.setdefault(str(index), {})[field] = [f"no {what} {name!r}"]
            elif known[name] != step["channel"]:
                problems.setdefault(str(index), {})[field] = [
                    f"{field} {name!r} is for channel {known[name]!r}, the step sends on {step['channel']!r}"
                ]
    if problems:
        errors["steps"] = problems
    if errors:
        raise ValidationError(errors)


def save_workflow(workflow: Workflow, *, actor: str, fields: Sequence[str] | None = None) -> Workflow:
    check_references(workflow.tenant, workflow.category, workflow.steps)

    def conflict(_: IntegrityError) -> Conflict:
        return Conflict(f"A workflow with key {workflow.key!r} already exists.", code="already_exists")

    return save_audited(workflow, actor=actor, noun="workflow", details={"key": workflow.key}, fields=fields,
                        conflict=conflict)  # fmt: skip


def delete_workflow(workflow: Workflow, *, actor: str) -> None:
    """Delete a workflow and its runs; 409 while some are unfinished (cancel them first)."""
    with transaction.atomic():
        # FOR UPDATE: a trigger holding the row (FOR KEY SHARE, _hold) commits its runs first, and one
        # coming after finds no workflow; its runs have no database foreign key to fail them.
        Workflow.objects.select_for_update().filter(pk=workflow.pk).first()
        fanning = Fanout.objects.for_tenant(workflow.tenant_id).filter(workflow=workflow, status="running")
        runs = WorkflowRun.objects.for_tenant(workflow.tenant_id).filter(workflow=workflow)
        if fanning.exists() or runs.unfinished().exists():
            raise Conflict(
                f"The workflow {workflow.key!r} has runs not finished yet: cancel them (POST workflows/{{key}}/cancel) "
                "or wait for them to end.",
                code="workflow_in_use",
            )
        AuditEvent.record(actor=actor, action="workflow.deleted", target=workflow, details={"key": workflow.key})
        try:
            workflow.delete()
        except ProtectedError:  # a bulk send names it
            raise Conflict("The workflow is still in use: a bulk send names it.", code="workflow_in_use") from None


def data_size(data: Any) -> int:  # noqa: ANN401
    """The size of `data` as compact JSON, in bytes of UTF-8."""
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())


def clean_trigger(body: Any) -> dict[str, Any]:  # noqa: ANN401
    """The trigger's fields, checked; ValidationError names each field."""
    if not isinstance(body, dict):
        raise ValidationError({"non_field_errors": ["the body must be a JSON object"]})
    errors: dict[str, list[str]] = {}
    for extra in sorted(set(body) - {"subscribers", "topic", "data", "cancellation_key", "actor"}):
        errors[extra] = ["unknown field; allowed: subscribers, topic, data, cancellation_key, actor"]
    subscribers = body.get("subscribers")
    topic = body.get("topic")
    ids: list[str] = []
    if topic is not None:
        if subscribers is not None:
            errors["topic"] = ["name either subscribers or a topic, not both"]
        elif not isinstance(topic, str) or not NAME.fullmatch(topic):
            errors["topic"] = ["must be a topic's key: 1 to 100 letters, digits, '-' or '_'"]
    elif not isinstance(subscribers, list) or not subscribers:
        errors["subscribers"] = ["required (or `topic`): a list of 1 to 1000 subscriber external ids"]
    elif len(subscribers) > MAX_SUBSCRIBERS:
        errors["subscribers"] = [f"at most {MAX_SUBSCRIBERS} subscribers a trigger; this one names {len(subscribers)}"]
    else:
        for index, value in enumerate(subscribers):
            try:
                external_id = recipients.check_external_id(value)
            except ValueError as exc:
                errors.setdefault("subscribers", []).append(f"item {index}: {exc}")
                continue
            if external_id not in ids:
                ids.append(external_id)  # one run per subscriber, in the order first named
    data = body.get("data", {})
    if not isinstance(data, dict):
        errors["data"] = ["must be an object (the template context's `data`)"]
    elif (size := data_size(data)) > MAX_DATA_BYTES:
        errors["data"] = [f"is {size} bytes as compact JSON; at most {MAX_DATA_BYTES} are allowed"]
    key = body.get("cancellation_key")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 200):
        errors["cancellation_key"] = ["must be a string of 1 to 200 characters"]
    if body.get("actor") is not None:
        try:
            recipients.check_external_id(body["actor"])
        except ValueError as exc:
            errors["actor"] = [str(exc)]
    if errors:
        raise ValidationError(errors)
    return {"subscribers": ids, "topic": topic, "data": data, "cancellation_key": body.get("cancellation_key"),
            "actor": body.get("actor")}  # fmt: skip


def trigger(
    tenant: Tenant, key: str, *, subscribers: Sequence[str], data: dict[str, Any], cancellation_key: str | None,
    trigger_actor: str | None, actor: str,
) -> tuple[uuid.UUID, int]:  # fmt: skip
    """One run per subscriber, each waiting on a job due now (in the caller's transaction, if any).
    Returns (trigger_id, runs)."""
    workflow = get_workflow(tenant, key)
    trigger_id = uuid.uuid4()
    with transaction.atomic():
        _hold(workflow)
        recipients.ensure_subscribers(tenant, subscribers)
        statements.start_runs(tenant.pk, workflow, trigger_id, list(subscribers), data=data,
                              cancellation_key=cancellation_key, actor=trigger_actor, job_kind=JOB_KIND,
                              test=mode_of(tenant))  # fmt: skip
    runs = subscribers
    logger.info("%s triggered workflow %s for %d subscriber(s)", actor, key, len(runs))
    return trigger_id, len(runs)


def trigger_topic(
    tenant: Tenant, key: str, *, topic: str, data: dict[str, Any], cancellation_key: str | None,
    trigger_actor: str | None, actor: str,
) -> tuple[uuid.UUID, int]:  # fmt: skip
    """A fan-out of the workflow to the topic's members at this moment, but `trigger_actor` (in the
    caller's transaction, if any); the scheduler creates the runs (workflows.fanout). Returns
    (trigger_id, runs it will create)."""
    workflow = get_workflow(tenant, key)
    trigger_id = uuid.uuid4()
    with transaction.atomic():
        _hold(workflow)
        try:
            found, boundary, members = topics.begin_fanout(tenant, topic, trigger_actor)
        except NotFound:
            raise ValidationError({"topic": [f"no topic with key {topic!r}"]}) from None
        Fanout.objects.create(
            id=trigger_id, tenant=tenant, workflow=workflow, topic_id=found.pk, topic_key=found.key,
            boundary=boundary, total=members, data=data, cancellation_key=cancellation_key, actor=trigger_actor,
            definition=workflow.steps, category=workflow.category, test=mode_of(tenant),
        )  # fmt: skip
        schedule.add_timed_jobs(tenant.pk, FANOUT_KIND, [(trigger_id, None, 0.0)])
    logger.info("%s triggered workflow %s for topic %s: %d run(s) to fan out", actor, key, topic, members)
    return trigger_id, members


def _hold(workflow: Workflow) -> None:
    """The workflow's row FOR KEY SHARE until the caller's transaction ends (triggers do not wait for
    each other, a delete waits for them); NotFound once it has been deleted."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM workflows WHERE id = %s FOR KEY SHARE", [workflow.pk])
        if cursor.fetchone() is None:
            raise NotFound("No workflow with this key.")


def fanouts_for(tenant: Tenant) -> QuerySet[Fanout]:
    """The tenant's fan-outs of the key's mode (a test key's triggers and cancels never touch live ones)."""
    return Fanout.objects.for_tenant(tenant).filter(test=mode_of(tenant))


def cancel_fanout(tenant: Tenant | None, fanout_id: object, *, actor: str) -> Fanout:
    """Stop a running fan-out (`tenant` None: any tenant's, for the admin, which scopes its own list):
    no further chunk is fanned out; the runs made so far go on. 409 unless it is running."""
    fanouts = Fanout.objects.all() if tenant is None else fanouts_for(tenant)
    fanout = fanouts.filter(pk=fanout_id).first()
    if fanout is None:
        raise NotFound("No fan-out with this id.")
    with transaction.atomic():
        # Its job first (the scheduler's order: job, then fan-out): a chunk in flight is waited for.
        schedule.cancel_jobs_for(FANOUT_KIND, [fanout.pk])
        if not fanout.stop():
            raise Conflict("Only a running fan-out can be cancelled; this one has finished.", code="not_running")
        topics.end_fanout(fanout.topic_id)
        fanout.refresh_from_db()
        details = {"topic": fanout.topic_key, "created": fanout.created, "total": fanout.total}
        AuditEvent.record(actor=actor, action="fanout.cancelled", target=fanout, details=details)
    logger.info("%s cancelled fan-out %s to topic %s at %d of %d runs", actor, fanout.pk, fanout.topic_key,
                fanout.created, fanout.total)  # fmt: skip
    return fanout


CANCEL_CHUNK = 10_000  # runs a cancel stops per transaction


def cancel(tenant: Tenant, key: str, cancellation_key: str, *, subscribers: Sequence[str] | None, actor: str) -> int:
    """Stop the workflow's unfinished runs with this cancellation key (of these subscribers, if given):
    they take no further step, and the notifications they scheduled end `cancelled`. Returns how many
    runs it stopped: the unfinished runs it found, plus, for named subscribers, those a running fan-out
    with this key has not reached yet (their runs will be created `cancelled`), if they are members of
    the topic now (one removed since the trigger still gets its cancelled run, uncounted: a removed
    membership has no index by subscriber to find it); 0 on a repeat.

    First, in one short transaction, the running fan-outs of the workflow with this key, their rows
    locked (a chunk being made commits first, and the next one sees what this one wrote): without
    `subscribers` they stop (the members they have not reached get no run); with them, the named
    members not reached yet are recorded, so each still has exactly one run and it is `cancelled`.
    Then the runs, CANCEL_CHUNK at a time, each chunk its own transaction of a fixed number of
    statements (statements.cancel_runs, then the notifications, set-based): a cancel of a broadcast
    never holds a million runs and their jobs locked, nor the table's oldest snapshot, for its whole
    length, and every committed chunk is whole (runs, their jobs and notifications together). Killed
    midway, it has stopped some runs; a repeat stops the rest (and counts only those)."""
    workflow = get_workflow(tenant, key)
    named = None if subscribers is None else list(dict.fromkeys(subscribers))
    with transaction.atomic():
        stopped = _stop_fanouts(tenant, workflow, cancellation_key, named)
    while True:
        with transaction.atomic():
            picked, changed, notification_ids = statements.cancel_runs(
                tenant.pk, workflow.pk, cancellation_key, subscribers=named, test=getattr(tenant, "test_mode", None),
                chunk=CANCEL_CHUNK, job_kinds=(JOB_KIND, SHARE_KIND),
            )  # fmt: skip
            notifications.cancel_scheduled(tenant, notification_ids, actor=actor)
        stopped += changed
        if picked < CANCEL_CHUNK:
            break
    if stopped:
        AuditEvent.record(actor=actor, action="workflow.cancelled", target=workflow,
                          details={"cancellation_key": cancellation_key, "runs": stopped})  # fmt: skip
    return stopped


def _stop_fanouts(tenant: Tenant, workflow: Workflow, cancellation_key: str, subscribers: list[str] | None) -> int:
    """The workflow's fan-outs still running with this cancellation key (the caller's transaction),
    their rows locked first, so a chunk being made commits before, and the next one comes after: without
    `subscribers` they end `cancelled`; with them, each records the named members it has not reached
    (their runs are made `cancelled`). Returns how many runs will be made cancelled."""
    running = fanouts_for(tenant).select_for_update().filter(
        workflow=workflow, cancellation_key=cancellation_key, status=Fanout.Status.RUNNING
    )
    ahead = 0
    for fan in running:
        if subscribers is None:
            Fanout.objects.filter(pk=fan.pk).update(status=Fanout.Status.CANCELLED, finished_at=Now())
            topics.end_fanout(fan.topic_id)
        elif subscribers:
            ahead += statements.cancel_ahead(fan, topics.member_ahead_sql, subscribers)
    return ahead


def runs_for(tenant: Tenant) -> QuerySet[WorkflowRun]:
    runs = WorkflowRun.objects.for_tenant(tenant).filter(workflow__kind=WorkflowKind.WORKFLOW)
    return runs.select_related("workflow")
