"""Advancing workflow runs: the handler the scheduler runs for due jobs of kind `workflow`.

A run waits on one scheduled job at a time (its `wake_id`): a trigger schedules it for now, a delay
for the delay's end, a digest window for the window's close. One batch is one transaction:
  1. the due jobs of this kind, locked FOR UPDATE SKIP LOCKED (queueing.scheduler.due_jobs_sql), so
     each goes to exactly one of several schedulers;
  2. their runs, locked, still unfinished and waiting on that very job (a cancel that committed first wins);
  3. each run advances in a savepoint, step after step, until it waits again or ends: a send step
     creates its notification through the one creation service (notifications.services), so
     preferences, suppressions, quiet hours, fallback and events apply; the run's row changes by a
     conditional update on (id, wake_id, status) whose row count must be one;
  4. the jobs end executed (or cancelled when their run had gone).
A scheduler killed anywhere in between rolls the whole batch back: the jobs are pending again and a
peer (or its restart) takes them; a step's effects and its state commit together, so each step runs
at most once, and in order."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models.functions import Now

from core.db_faults import is_connection_lost
from inbox.models import InboxItem
from notifications import services
from notifications.models import Notification, Status
from notifications.validation import Draft
from queueing import schedule, scheduler
from receipts.models import NotificationEvent
from recipients.models import Subscriber
from templating import renderer
from workflows import statements
from workflows.models import UNFINISHED, RunStatus, StepStatus, WorkflowRun
from workflows.steps import delay_until, key_value

logger = logging.getLogger("omnipost.workflows")

JOB_KIND = "workflow"
# Runs advanced per transaction: each costs a few statements (more with a send step), but a run whose
# next step is a send and the last one costs none of its own (sends made together, runs ended
# together); the batch's jobs stay locked until it commits.
BATCH = 500
NO_ADDRESS = "no_address"


class _Lost(Exception):
    """The run's row was no longer the one this batch locked (cannot happen under the lock; checked anyway)."""


class _Finished(Exception):
    """The run ended at this step (throttled, digested)."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


_ANY_DUE = f"""SELECT 1 FROM scheduled_jobs
WHERE status = 'pending' AND run_at <= now() AND kind = '{JOB_KIND}' LIMIT 1"""  # noqa: S608 - constants


def promote(batch_size: int, using: str) -> scheduler.Promotion:
    """Advance the runs of up to `batch_size` (at most BATCH) due jobs (queueing.scheduler.PromotionHandler)."""
    with connections[using].cursor() as cursor:  # one statement when none is due (the usual case)
        cursor.execute(_ANY_DUE)
        if cursor.fetchone() is None:
            return scheduler.Promotion(0, 0)
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute(scheduler.due_jobs_sql(JOB_KIND), {"n": min(batch_size, BATCH)})
            due = cursor.fetchall()
            if not due:
                return scheduler.Promotion(0, 0)
            cursor.execute("SELECT now()")
            (now,) = cursor.fetchone()
        runs = {
            run.wake_id: run
            for run in WorkflowRun.objects.using(using)
            .select_related("tenant", "workflow")
            .select_for_update(of=("self",))
            .filter(wake_id__in=[wake for _, wake, _ in due], status__in=UNFINISHED)
        }
        prepare_sends([runs[wake] for _, wake, _ in due if wake in runs], using)
        ended = _end_prepared(list(runs.values()))
        executed, cancelled, lag = [], [], 0.0
        for job_id, wake, run_at in due:
            run = runs.get(wake)
            if run is None:  # cancelled meanwhile, or its workflow deleted
                cancelled.append(job_id)
                continue
            if run.pk in ended:  # its last step, a send made with the batch's: ended with them
                executed.append(job_id)
                lag = max(lag, (now - run_at).total_seconds())
                continue
            try:
                with transaction.atomic(using=using):
                    advance(run, now, using=using)
            except _Lost:
                cancelled.append(job_id)
                continue
            except Exception as exc:
                if is_connection_lost(exc):
                    raise
                logger.exception("workflow run %s failed at step %d", run.pk, run.step_index)
                with transaction.atomic(using=using):
                    _fail(run, f"{type(exc).__name__}: {exc}"[:500])
            executed.append(job_id)
            lag = max(lag, (now - run_at).total_seconds())
        schedule.settle_jobs(executed, cancelled, using=using)
    return scheduler.Promotion(len(executed), len(cancelled), max_lag=lag if executed else None)


def advance(run: WorkflowRun, now: datetime, *, using: str = "default") -> None:
    """Run `run`'s steps from where it waits until it waits again or ends (in the caller's transaction,
    the run's row locked)."""
    states = [dict(state) for state in run.steps]
    index = run.step_index
    if index < len(states) and states[index]["status"] == StepStatus.WAITING:
        states[index]["status"] = StepStatus.DONE  # the wait this job stood for is over
        index += 1
        if run.definition[index - 1]["type"] == "digest":  # its window closed: this run goes on with it
            run.digest = statements.close_digest(run, run.definition[index - 1]["name"])
    zone: list[str] = []  # the subscriber's timezone, read once when a step needs it
    try:
        while index < len(run.definition):
            run.reached = index  # where a failure is recorded (the savepoint undoes this batch's steps)
            step = run.definition[index]
            kind = step["type"]
            if kind == "send":
                states[index].update(_send(run, step, states, using))
            elif kind == "delay":
                if step.get("until_local") and not zone:
                    zone.append(_timezone(run))
                at = delay_until(step, zone[0] if zone else "", now)
                return _wait(run, states, index, at, using)
            elif kind == "throttle":
                key = key_value(run.data, step.get("key"))
                if not statements.pass_throttle(run, step["name"], key, step["limit"], step["window_seconds"]):
                    states[index].update(status=StepStatus.SKIPPED, reason="throttled")
                    raise _Finished(RunStatus.THROTTLED)
                states[index]["status"] = StepStatus.DONE
            elif kind == "digest":
                at = statements.join_digest(run, step, now)
                if at is None:
                    states[index].update(status=StepStatus.SKIPPED, reason="digested")
                    raise _Finished(RunStatus.DIGESTED)
                return _wait(run, states, index, at, using)
            index += 1
    except _Finished as finished:
        return _end(run, states, index, finished.status)
    return _end(run, states, index, RunStatus.COMPLETED)


def _timezone(run: WorkflowRun) -> str:
    return (
        Subscriber.objects.for_tenant(run.tenant_id)
        .filter(external_id=run.subscriber)
        .values_list("timezone", flat=True)
        .first()
        or ""
    )


def _context(run: WorkflowRun) -> dict[str, Any]:
    context: dict[str, Any] = {"data": run.data, "subscriber": {"external_id": run.subscriber}}
    if run.actor:
        context["actor"] = run.actor
    if run.digest is not None:
        context["digest"] = run.digest
    return context


def _draft(run: WorkflowRun, step: dict[str, Any]) -> Draft:
    """The send step's notification as a draft, its own subject and body rendered (StepError if they cannot)."""
    context = _context(run)
    subject, body = step.get("subject") or "", step.get("body") or ""
    if not step.get("template"):  # a step's own subject and body are templates too, on the same context
        try:
            subject = renderer.render(subject, context, autoescape=False) if subject else ""
            body = renderer.render(body, context, autoescape=False)
        except renderer.TemplateError as exc:
            raise StepError(f"rendering the step's subject or body: {exc}") from None
    return Draft(
        channel=step["channel"], recipient="", subscriber=run.subscriber, provider=step.get("provider"),
        template=step.get("template"), subject=subject, body=body, context=context, category=run.category,
        metadata={"workflow": run.workflow.key, "workflow_run_id": str(run.pk), "step": step["name"]},
    )  # fmt: skip


def _create(run: WorkflowRun, drafts: list[Draft]) -> list[Notification]:
    """The drafts' notifications, through the one creation service (SpecErrors as it raises them)."""
    try:
        specs = services.build_specs(run.tenant, drafts)
        return services.create_notifications(run.tenant, specs, actor=f"workflow:{run.workflow.key}")
    except services.StaleConfig:
        specs = services.build_specs(run.tenant, drafts, cached=False)
        return services.create_notifications(run.tenant, specs, actor=f"workflow:{run.workflow.key}")


def _send(run: WorkflowRun, step: dict[str, Any], states: list[dict[str, Any]], using: str) -> dict[str, Any]:
    """The send step's state: done with its notification, or skipped (skip_if met, no address)."""
    prepared = getattr(run, "prepared", None)
    if prepared is not None and prepared[0] == step["name"]:
        return prepared[1]
    condition = step.get("skip_if")
    if condition:
        earlier = next((s for s in states if s["name"] == condition["step"]), None)
        notification_id = earlier.get("notification_id") if earlier else None
        if notification_id and reached(run.tenant_id, notification_id, condition["state"], using=using):
            return {"status": StepStatus.SKIPPED, "reason": f"{condition['step']} {condition['state']}"}
    try:
        rows = _create(run, [_draft(run, step)])
    except services.SpecErrors as exc:
        problems = exc.errors.get(0, {})
        if set(problems) == {"subscriber"}:  # no address (or no device) for the channel
            return {"status": StepStatus.SKIPPED, "reason": NO_ADDRESS}
        raise StepError("; ".join(f"{field}: {' '.join(messages)}" for field, messages in problems.items())) from None
    return {"status": StepStatus.DONE, "notification_id": str(rows[0].pk)}


def prepare_sends(runs: list[WorkflowRun], using: str) -> None:
    """The batch's runs whose next step is a send without `skip_if` (a fan-out's runs, typically) get
    that step's notifications made together: one build and one creation statement per tenant and
    workflow instead of one per run. Each run then finds its step's state ready (`run.prepared`);
    a group that cannot be made together (a step error) is left to the runs, one by one."""
    groups: dict[tuple[Any, Any], list[tuple[WorkflowRun, dict[str, Any]]]] = {}
    for run in runs:
        index = run.step_index
        if index >= len(run.definition) or run.steps[index]["status"] != StepStatus.PENDING:
            continue
        step = run.definition[index]
        if step["type"] == "send" and not step.get("skip_if"):
            groups.setdefault((run.tenant_id, run.workflow_id), []).append((run, step))
    for group in groups.values():
        if len(group) < 2:
            continue
        try:
            with transaction.atomic(using=using):
                _prepare_group(group)
        except Exception as exc:
            if is_connection_lost(exc):
                raise
            logger.warning("workflow sends made one by one (%s: %s)", type(exc).__name__, str(exc)[:200])
            for run, _ in group:
                run.prepared = None


def _end_prepared(runs: list[WorkflowRun]) -> set[Any]:
    """The runs whose prepared send is their last step end `completed` together, in one conditional
    statement (workflows.statements.end_runs); returns their ids. The others advance one by one."""
    ending = []
    for run in runs:
        prepared = getattr(run, "prepared", None)
        index = run.step_index
        if prepared is None or index != len(run.definition) - 1:
            continue
        states = [dict(state) for state in run.steps]
        states[index].update(prepared[1])
        ending.append((run, states, index))
    if not ending:
        return set()
    return statements.end_runs(ending)


def _prepare_group(group: list[tuple[WorkflowRun, dict[str, Any]]]) -> None:
    drafts = [_draft(run, step) for run, step in group]
    first = group[0][0]
    states: dict[int, dict[str, Any]] = {}
    try:
        rows = _create(first, drafts)
        keep = list(range(len(group)))
    except services.SpecErrors as exc:
        keep = []
        for index in range(len(group)):
            problems = exc.errors.get(index)
            if not problems:
                keep.append(index)
            elif set(problems) == {"subscriber"}:
                states[index] = {"status": StepStatus.SKIPPED, "reason": NO_ADDRESS}
            else:
                raise StepError("; ".join(f"{f}: {' '.join(m)}" for f, m in problems.items())) from None
        rows = _create(first, [drafts[i] for i in keep]) if keep else []
    for index, row in zip(keep, rows, strict=True):
        states[index] = {"status": StepStatus.DONE, "notification_id": str(row.pk)}
    for index, (run, step) in enumerate(group):
        run.prepared = (step["name"], states[index])


class StepError(Exception):
    """A send step that cannot create its notification (its template or provider is gone): the run fails."""


def reached(tenant_id: Any, notification_id: Any, state: str, *, using: str = "default") -> bool:  # noqa: ANN401
    """Whether a notification has reached `state`: `delivered` (the provider accepted it), `seen` or
    `read` (its in-app item, or a `seen`/`read` event among its receipts; read implies seen)."""
    if state == "delivered":
        return (
            Notification.objects.using(using).for_tenant(tenant_id)
            .filter(pk=notification_id, status=Status.DELIVERED).exists()
        )  # fmt: skip
    items = InboxItem.objects.using(using).for_tenant(tenant_id).filter(notification_id=notification_id)
    if state == "read":
        if items.filter(first_read_at__isnull=False).exists():
            return True
        types = ["read"]
    else:
        if items.exclude(seen_at__isnull=True, first_read_at__isnull=True).exists():
            return True
        types = ["seen", "read"]
    return NotificationEvent.objects.using(using).filter(notification_id=notification_id, type__in=types).exists()


def _save(run: WorkflowRun, **changes: Any) -> None:
    """The run's row, changed only while it still waits on the job this batch holds."""
    updated = WorkflowRun.objects.filter(pk=run.pk, wake_id=run.wake_id, status__in=UNFINISHED).update(
        updated_at=Now(), **changes
    )
    if updated != 1:
        raise _Lost(str(run.pk))


def _wait(run: WorkflowRun, states: list[dict[str, Any]], index: int, at: datetime, using: str) -> None:
    wake = uuid.uuid4()
    states[index].update(status=StepStatus.WAITING, at=at.isoformat())
    _save(run, step_index=index, steps=states, wake_id=wake, digest=run.digest, status=RunStatus.WAITING)
    schedule.add_timed_jobs(run.tenant_id, JOB_KIND, [(wake, at, 0.0)], using=using)


def _end(run: WorkflowRun, states: list[dict[str, Any]], index: int, status: str) -> None:
    _save(
        run,
        step_index=min(index, max(len(states) - 1, 0)),
        steps=states,
        wake_id=None,
        status=status,
        digest=run.digest,
    )


def _fail(run: WorkflowRun, reason: str) -> None:
    states = [dict(state) for state in run.steps]
    index = getattr(run, "reached", run.step_index)
    if index < len(states):
        states[index]["reason"] = reason
    _save(run, steps=states, wake_id=None, status=RunStatus.FAILED)
