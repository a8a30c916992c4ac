"""Advancing workflow runs: the handlers the scheduler runs for due jobs of kind `workflow` (a run
waiting alone) and `workflow_share` (a fan-out's runs waiting together, up to BATCH a job).

A run waits on one scheduled job at a time (its `wake_id`): a trigger schedules it for now, a delay
for the delay's end, a digest window for the window's close. One batch is one transaction:
  1. the due jobs of this kind, locked FOR UPDATE SKIP LOCKED (queueing.scheduler.due_jobs_sql), so
     each goes to exactly one of several schedulers;
  2. their runs, locked, still unfinished and waiting on that very job (a cancel that committed first wins);
  3. every run walks its steps in memory until it waits again or ends (throttle, digest and skip_if
     steps run their own single statements); then, in a savepoint and a fixed number of statements
     whatever the runs' count: the subscribers' time zones the delays need, per tenant the sends'
     notifications through the one creation service's batch path (notifications.services: so
     preferences, suppressions, quiet hours, fallback and events apply) and the waits' jobs, and every
     run's new state in one conditional UPDATE on (id, wake_id, status) whose row count must be all;
  4. the jobs end executed (or cancelled when their run had gone).
When the batch cannot go through (a step's template gone, a subject that fails to render), its
savepoint is undone and each run goes again on its own, so only that run fails.
A scheduler killed anywhere in between rolls the whole batch back: the jobs are pending again and a
peer (or its restart) takes them; a step's effects and its state commit together, so each step runs
at most once, and in order."""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from core.db_faults import is_connection_lost
from core.models import Tenant
from inbox.models import InboxItem
from notifications import services
from notifications.models import Notification, Status
from notifications.validation import Draft
from queueing import schedule, scheduler
from receipts.models import NotificationEvent
from recipients.models import Subscriber
from templating import renderer
from workflows import statements
from workflows.models import UNFINISHED, RunStatus, StepStatus, Workflow, WorkflowRun, resolve_runs
from workflows.steps import delay_until, key_value

logger = logging.getLogger("omnipost.workflows")

# A run's own job (a trigger's first step, a delay's end, a digest window's close): one run waits on it.
JOB_KIND = "workflow"
# A topic's fan-out makes its runs' first steps due at once: up to BATCH of them share one job of this
# kind. The scheduler promotes each kind in its own turn, so a broadcast's runs never stand in front
# of another trigger's in the due order: a password reset triggered during a million-run broadcast
# waits for one batch of the broadcast, not for the broadcast.
SHARE_KIND = "workflow_share"
# Runs advanced per transaction (a fixed number of statements whatever their count): their jobs stay
# locked until it commits.
BATCH = 500
NO_ADDRESS = "no_address"


class _Lost(Exception):
    """The run's row was no longer the one this batch locked (cannot happen under the lock; checked anyway)."""


class _Finished(Exception):
    """The run ended at this step (throttled, digested)."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def promote(batch_size: int, using: str) -> scheduler.Promotion:
    """Advance the runs of due jobs of JOB_KIND, up to `batch_size` (at most BATCH) of them
    (queueing.scheduler.PromotionHandler)."""
    limit = min(batch_size, BATCH)
    return _promote(JOB_KIND, limit, limit, using)


def promote_shares(batch_size: int, using: str, *, due: bool = False) -> scheduler.Promotion:
    """Advance the runs of the oldest due fan-out share (SHARE_KIND), up to `batch_size` (at most
    BATCH) of them: one job, which stays pending (and due) while some of its runs still wait on it.
    `due`: the caller has just seen one due (workflows.fanout.promote_shares)."""
    return _promote(SHARE_KIND, 1, min(batch_size, BATCH), using, due=due)


def _promote(kind: str, jobs: int, limit: int, using: str, *, due: bool = False) -> scheduler.Promotion:
    """Up to `limit` runs of up to `jobs` due jobs of `kind`, advanced in one transaction."""
    if not due and not scheduler.any_due(kind, using=using):  # one statement when none is due (the usual case)
        return scheduler.Promotion(0, 0)
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute(scheduler.due_jobs_sql(kind), {"n": jobs})
            due = cursor.fetchall()
            if not due:
                return scheduler.Promotion(0, 0)
            cursor.execute("SELECT now()")
            (now,) = cursor.fetchone()
        wakes = [wake for _, wake, _ in due]
        runs = _locked_runs(wakes, using, limit=limit)
        advanced = len(runs)
        try:
            with transaction.atomic(using=using):
                _advance_batch(runs, now, using, kind)
        except Exception as exc:
            if is_connection_lost(exc):
                raise
            # A run the batch could not advance (a template gone, a step that fails to render): the
            # savepoint undid the whole batch; each run goes again on its own, so only it fails.
            logger.info("workflow batch of %d run(s) retried run by run: %s", len(runs), exc)
            advanced = sum(_advance_alone(run, now, using) for run in _relocked(runs, using))
        # a job some run still waits on stays pending; one whose runs are all gone (cancelled
        # meanwhile, or their workflow deleted) ends cancelled
        waited = _still_waited_on(wakes, using)
        touched = {run.wake_id for run in runs}
        executed = [job_id for job_id, wake, _ in due if wake in touched and wake not in waited]
        cancelled = [job_id for job_id, wake, _ in due if wake not in touched and wake not in waited]
        lag = max(((now - run_at).total_seconds() for _, wake, run_at in due if wake in touched), default=0.0)
        schedule.settle_jobs(executed, cancelled, using=using)
    return scheduler.Promotion(advanced, len(cancelled), max_lag=lag if advanced else None)


# The runs due jobs stand for, taken round-robin across the jobs (each job's first run, then each
# one's second, …), so the runs of a fan-out's jobs do not hold back the single runs of the jobs
# beside them.
_DUE_RUNS = """SELECT r.id FROM unnest(%s::uuid[]) WITH ORDINALITY AS w(wake, n)
CROSS JOIN LATERAL (
    SELECT id FROM workflow_runs WHERE wake_id = w.wake AND status IN ('running', 'waiting') LIMIT %s
) r
ORDER BY row_number() OVER (PARTITION BY w.n), w.n
LIMIT %s"""
# The jobs among these that some unfinished run still waits on (one index probe each).
_WAITED_ON = """SELECT w.wake FROM unnest(%s::uuid[]) AS w(wake)
WHERE EXISTS (SELECT 1 FROM workflow_runs WHERE wake_id = w.wake AND status IN ('running', 'waiting'))"""


def _locked_runs(wakes: list[Any], using: str, *, limit: int) -> list[WorkflowRun]:
    """Up to `limit` unfinished runs waiting on these jobs (held by the caller), locked, what fan-out
    runs leave NULL filled from their fan-outs (one statement, and one more for the fan-outs)."""
    runs = list(
        WorkflowRun.objects.using(using)
        .select_for_update()
        .filter(pk__in=RawSQL(_DUE_RUNS, [wakes, limit, limit]),  # noqa: S611 - a constant
                wake_id__in=wakes, status__in=UNFINISHED)
        .order_by()
    )
    runs = _with_owners(runs, using)
    # Advanced in their jobs' due order (then creation order, the ids being version 7), as the jobs
    # were taken: of triggers joining one digest, the first accepted leads it and its items go oldest
    # first whatever order the rows came back in.
    position = {wake: n for n, wake in enumerate(wakes)}
    runs.sort(key=lambda run: (position.get(run.wake_id, len(position)), run.pk))
    _prepare(runs, using)
    return runs


def _with_owners(runs: list[WorkflowRun], using: str) -> list[WorkflowRun]:
    """The runs with their tenants and workflows attached, read once per batch (two queries), not once
    per run: a fan-out's share is 500 runs of one workflow. A run whose workflow or tenant has gone
    (runs carry no foreign keys) ends `failed` here, in the batch's transaction, so that its job
    settles instead of coming back at every turn in front of the shares behind it. Each (tenant,
    mode) gets its own Tenant instance: the run's mode for its sends."""
    if not runs:
        return runs
    tenants = {t.pk: t for t in Tenant.objects.using(using).filter(pk__in={run.tenant_id for run in runs})}
    workflows = {w.pk: w for w in Workflow.objects.using(using).filter(pk__in={run.workflow_id for run in runs})}
    modes: dict[tuple[Any, bool], Tenant] = {}
    kept, orphans = [], []
    for run in runs:
        workflow = workflows.get(run.workflow_id)
        if workflow is None or run.tenant_id not in tenants:
            orphans.append(run.pk)
            continue
        tenant = modes.get((run.tenant_id, run.test))
        if tenant is None:
            tenant = modes[run.tenant_id, run.test] = copy.copy(tenants[run.tenant_id])
        run.tenant, run.workflow = tenant, workflow
        kept.append(run)
    if orphans:
        logger.warning("%d workflow run(s) whose workflow or tenant is gone end failed", len(orphans))
        WorkflowRun.objects.using(using).filter(pk__in=orphans).update(
            status=RunStatus.FAILED, wake_id=None, updated_at=Now()
        )
    return kept


def _relocked(runs: list[WorkflowRun], using: str) -> list[WorkflowRun]:
    """The same runs read again (as the undone savepoint left them; their locks are held)."""
    again = list(
        WorkflowRun.objects.using(using).select_related("tenant", "workflow")
        .filter(pk__in=[run.pk for run in runs], status__in=UNFINISHED)
    )  # fmt: skip
    _prepare(again, using)
    return again


def _prepare(runs: list[WorkflowRun], using: str) -> None:
    resolve_runs(runs, using=using)
    for run in runs:  # a Tenant instance per tenant and mode (_with_owners): the run's mode for its sends
        run.tenant.test_mode = run.test


def _still_waited_on(wakes: list[Any], using: str) -> set[Any]:
    """The jobs among `wakes` some unfinished run still waits on (one statement)."""
    with connections[using].cursor() as cursor:
        cursor.execute(_WAITED_ON, [wakes])
        return {row[0] for row in cursor.fetchall()}


def _advance_alone(run: WorkflowRun, now: datetime, using: str) -> bool:
    """Advance one run in its own savepoint; a failing step fails the run. False when its row was lost."""
    try:
        with transaction.atomic(using=using):
            advance(run, now, using=using)
    except _Lost:
        return False
    except Exception as exc:
        if is_connection_lost(exc):
            raise
        logger.exception("workflow run %s failed at step %d", run.pk, getattr(run, "reached", run.step_index))
        with transaction.atomic(using=using):
            _fail(run, f"{type(exc).__name__}: {exc}"[:500])
    return True


# A step's send, as a walk sees it: the step's new state, given (run, step, states, index).
SendStep = Callable[[WorkflowRun, dict[str, Any], list[dict[str, Any]], int], dict[str, Any]]


def _walk(
    run: WorkflowRun, now: datetime, states: list[dict[str, Any]], send: SendStep, zone: Callable[[], str]
) -> tuple[str, int, datetime | None]:
    """Take `run`'s steps from where it waits until it waits again or ends, changing `states`; returns
    (status, the step's index it stopped at, when its wait ends or None). Throttle and digest steps
    run their conditional statements here; sends go through `send`."""
    index = run.step_index
    if index < len(states) and states[index]["status"] == StepStatus.WAITING:
        states[index]["status"] = StepStatus.DONE  # the wait this job stood for is over
        index += 1
        if run.definition[index - 1]["type"] == "digest":  # its window closed: this run goes on with it
            run.digest = statements.close_digest(run, run.definition[index - 1]["name"])
    try:
        while index < len(run.definition):
            run.reached = index  # where a failure is recorded
            step = run.definition[index]
            kind = step["type"]
            if kind == "send":
                states[index].update(send(run, step, states, index))
            elif kind == "delay":
                at = delay_until(step, zone() if step.get("until_local") else "", now)
                states[index].update(status=StepStatus.WAITING, at=at.isoformat())
                return RunStatus.WAITING, index, at
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
                states[index].update(status=StepStatus.WAITING, at=at.isoformat())
                return RunStatus.WAITING, index, at
            index += 1
    except _Finished as finished:
        return finished.status, index, None
    return RunStatus.COMPLETED, index, None


def advance(run: WorkflowRun, now: datetime, *, using: str = "default") -> None:
    """Run `run`'s steps from where it waits until it waits again or ends (in the caller's transaction,
    the run's row locked): one run on its own, each send creating its notification at once."""
    states = [dict(state) for state in run.steps]
    zone: list[str] = []  # the subscriber's timezone, read once when a step needs it

    def timezone_of() -> str:
        if not zone:
            zone.append(_timezone(run))
        return zone[0]

    def send(run: WorkflowRun, step: dict[str, Any], states: list[dict[str, Any]], index: int) -> dict[str, Any]:
        return _send(run, step, states, using)

    status, index, at = _walk(run, now, states, send, timezone_of)
    if at is not None:
        return _wait(run, states, index, at, using)
    return _end(run, states, index, status)


@dataclass
class _Plan:
    """One run's walk in a batch: where it stopped, and the sends whose notifications the batch creates."""

    run: WorkflowRun
    states: list[dict[str, Any]]
    status: str = RunStatus.RUNNING
    index: int = 0
    at: datetime | None = None
    wake: uuid.UUID | None = None
    sends: list[tuple[int, Draft]] = field(default_factory=list)


def _advance_batch(runs: list[WorkflowRun], now: datetime, using: str, kind: str = JOB_KIND) -> None:
    """Advance `runs` together (in the caller's savepoint, their rows locked), in a fixed number of
    statements whatever their count, besides each throttle, digest and skip_if step's own: the time
    zones the delays need (one query), per tenant the sends' notifications through the batch creation
    path (its subscriber read and its one creation statement) and the waits' jobs (one INSERT), and
    every run's new state (one UPDATE). A share's runs (`kind` SHARE_KIND) that wait until the same
    time wait on one job of that kind again: a broadcast's delay stays out of the single runs' turn."""
    zones = _timezones(runs, using)
    shared_wakes: dict[tuple[Any, datetime], uuid.UUID] = {}
    rendered = _Rendered()
    plans: list[_Plan] = []
    for run in runs:
        plan = _Plan(run, [dict(state) for state in run.steps])

        def send(run: WorkflowRun, step: dict[str, Any], states: list[dict[str, Any]], index: int,
                 plan: _Plan = plan) -> dict[str, Any]:  # fmt: skip
            outcome = _draft(run, step, states, using, rendered)
            if isinstance(outcome, Draft):
                plan.sends.append((index, outcome))
                return {"status": StepStatus.DONE, "notification_id": None}  # its id once created below
            return outcome

        def zone(run: WorkflowRun = run) -> str:
            return zones.get((run.tenant_id, run.subscriber), "")

        plan.status, plan.index, plan.at = _walk(run, now, plan.states, send, zone)
        if plan.at is not None:
            if kind == SHARE_KIND:
                plan.wake = shared_wakes.setdefault((run.tenant_id, plan.at), uuid.uuid4())
            else:
                plan.wake = uuid.uuid4()
        plans.append(plan)
    by_tenant: dict[Any, list[tuple[_Plan, int, Draft]]] = {}
    for plan in plans:
        for index, draft in plan.sends:
            # one creation per tenant and mode: a test run's sends are test notifications
            by_tenant.setdefault((plan.run.tenant_id, plan.run.test), []).append((plan, index, draft))
    for sends in by_tenant.values():
        _create(sends)
    statements.record_runs([
        (plan.run.pk, plan.run.wake_id, plan.status, min(plan.index, max(len(plan.states) - 1, 0)), plan.states,
         plan.wake, plan.run.digest)
        for plan in plans
    ], using=using)  # fmt: skip
    waits: dict[Any, dict[Any, tuple[Any, datetime | None, float]]] = {}
    for plan in plans:
        if plan.wake is not None:  # one job per wake (a share's runs may share one)
            waits.setdefault(plan.run.tenant_id, {})[plan.wake] = (plan.wake, plan.at, 0.0)
    for tenant_id, timed in waits.items():
        schedule.add_timed_jobs(tenant_id, kind, list(timed.values()), using=using)


def _create(sends: list[tuple[_Plan, int, Draft]]) -> None:
    """One tenant's sends of a batch: their notifications in one creation (a send to a channel its
    subscriber has no address for is skipped, `no_address`); another problem raises StepError."""
    tenant = sends[0][0].run.tenant
    try:
        specs = services.build_specs(tenant, [draft for _, _, draft in sends])
    except services.SpecErrors as exc:
        if any(set(problems) != {"subscriber"} for problems in exc.errors.values()):
            raise StepError(f"{len(exc.errors)} send step(s) cannot create their notification") from None
        for position in exc.errors:
            plan, index, _ = sends[position]
            plan.states[index].update(status=StepStatus.SKIPPED, reason=NO_ADDRESS)
        sends = [send for position, send in enumerate(sends) if position not in exc.errors]
        if not sends:
            return
        specs = services.build_specs(tenant, [draft for _, _, draft in sends])
    try:
        rows = services.create_notifications(tenant, specs, actor="scheduler:workflows")
    except services.StaleConfig:
        specs = services.build_specs(tenant, [draft for _, _, draft in sends], cached=False)
        rows = services.create_notifications(tenant, specs, actor="scheduler:workflows")
    for (plan, index, _), row in zip(sends, rows, strict=True):
        plan.states[index]["notification_id"] = str(row.pk)


def _timezones(runs: list[WorkflowRun], using: str) -> dict[tuple[Any, str], str]:
    """(tenant, subscriber) → time zone, for the runs whose definition has an `until_local` delay (one query)."""
    wanted = [run for run in runs if any(step.get("until_local") for step in run.definition)]
    if not wanted:
        return {}
    rows = (
        Subscriber.objects.using(using)
        .filter(tenant_id__in={run.tenant_id for run in wanted}, external_id__in={run.subscriber for run in wanted})
        .values_list("tenant_id", "external_id", "timezone")
    )
    return {(tenant_id, external_id): zone or "" for tenant_id, external_id, zone in rows}


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


class _Rendered:
    """A batch's renders of step subjects and bodies, kept where the result cannot differ between
    runs: a text that never names `subscriber` (as text: a loop or `with` variable of that name
    hides a read of the real one from renderer.variables) nor `random`, for runs sharing one `data`
    object (a fan-out's runs share their fan-out's) and actor, without a digest. A broadcast's share
    of 500 runs renders each text once instead of 500 times (each render deep-copies the context, up
    to 32 KiB of data)."""

    def __init__(self) -> None:
        self.texts: dict[tuple[str, int, str | None], str] = {}

    def __call__(self, text: str, run: WorkflowRun, context: dict[str, Any]) -> str:
        if "{" not in text:  # no tag, no variable: itself
            return text
        shared = run.digest is None and "subscriber" not in text and "random" not in text
        key = (text, id(run.data), run.actor)
        if shared and key in self.texts:
            return self.texts[key]
        output = renderer.render(text, context, autoescape=False)
        if shared:
            self.texts[key] = output
        return output


def _draft(
    run: WorkflowRun, step: dict[str, Any], states: list[dict[str, Any]], using: str, rendered: _Rendered | None = None
) -> Draft | dict[str, Any]:
    """The send step's notification to create, or its state when skipped (its skip_if met); `rendered`:
    the batch's renders, to share."""
    condition = step.get("skip_if")
    if condition:
        earlier = next((s for s in states if s["name"] == condition["step"]), None)
        notification_id = earlier.get("notification_id") if earlier else None
        # (a notification created in this very batch has no id yet: it cannot have been delivered or read)
        if notification_id and reached(run.tenant_id, notification_id, condition["state"], using=using):
            return {"status": StepStatus.SKIPPED, "reason": f"{condition['step']} {condition['state']}"}
    context = _context(run)
    subject, body = step.get("subject") or "", step.get("body") or ""
    if not step.get("template"):  # a step's own subject and body are templates too, on the same context
        render = rendered or _Rendered()
        try:
            subject = render(subject, run, context) if subject else ""
            body = render(body, run, context)
        except renderer.TemplateError as exc:
            raise StepError(f"rendering the step's subject or body: {exc}") from None
    return Draft(
        channel=step["channel"], recipient="", subscriber=run.subscriber, provider=step.get("provider"),
        template=step.get("template"), subject=subject, body=body, context=context, category=run.category,
        metadata={"workflow": run.workflow.key, "workflow_run_id": str(run.pk), "step": step["name"]},
    )  # fmt: skip


def _send(run: WorkflowRun, step: dict[str, Any], states: list[dict[str, Any]], using: str) -> dict[str, Any]:
    """The send step's state: done with its notification (created now), or skipped (skip_if met, no address)."""
    draft = _draft(run, step, states, using)
    if not isinstance(draft, Draft):
        return draft
    try:
        try:
            specs = services.build_specs(run.tenant, [draft])
            rows = services.create_notifications(run.tenant, specs, actor=f"workflow:{run.workflow.key}")
        except services.StaleConfig:
            specs = services.build_specs(run.tenant, [draft], cached=False)
            rows = services.create_notifications(run.tenant, specs, actor=f"workflow:{run.workflow.key}")
    except services.SpecErrors as exc:
        problems = exc.errors.get(0, {})
        if set(problems) == {"subscriber"}:  # no address (or no device) for the channel
            return {"status": StepStatus.SKIPPED, "reason": NO_ADDRESS}
        raise StepError("; ".join(f"{field}: {' '.join(messages)}" for field, messages in problems.items())) from None
    return {"status": StepStatus.DONE, "notification_id": str(rows[0].pk)}


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
