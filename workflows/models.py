"""Workflows (a tenant's named list of steps) and their runs (one per trigger and subscriber).

A run is data: its status, the index of the step it is at, each step's state, and `wake_id`, the
opaque id of the scheduled job (kind `workflow`, or `workflow_share` for a fan-out's) it waits on.
The scheduler advances a run when that job is due (workflows.engine), inside the transaction that
settles the job; every change of a run is a conditional update on its status and wake_id, so two
schedulers (or a cancel) never both win.

A topic fan-out's runs are written narrow: their `data` and `definition` are NULL, standing for their
fan-out's (the Fanout whose id is their trigger_id), and so are their `steps` until their first step
(the definition's steps, all pending); the runs of one chunk wait on one job together (one wake_id).
`resolve_runs` fills them in memory for whoever reads them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models import Q, Value
from django.db.models.functions import Now

from core.fields import EncryptedTextField
from core.ids import uuid7
from core.models import Tenant, TenantOwned
from core.models.tenancy import HOT_FK, ModeOwnedQuerySet


class WorkflowKind(models.TextChoices):
    WORKFLOW = "workflow"
    # A drip sequence (`sequences/{key}`): send steps to one recipient, with fixed delays between them;
    # its enrollments are runs planned at their start (workflows.sequences).
    SEQUENCE = "sequence"


class Workflow(TenantOwned):
    kind = models.CharField(max_length=10, choices=WorkflowKind.choices, default=WorkflowKind.WORKFLOW)
    key = models.SlugField(max_length=100)
    name = models.CharField(max_length=200, blank=True, default="")
    category = models.CharField(max_length=100, default="general")
    steps = models.JSONField(default=list)  # checked by workflows.steps.clean_steps
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "workflows"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "kind", "key"], name="workflow_key_unique_per_tenant_kind")
        ]

    def __str__(self) -> str:
        return self.key


class RunStatus(models.TextChoices):
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    DIGESTED = "digested"
    THROTTLED = "throttled"
    FAILED = "failed"


UNFINISHED = (RunStatus.RUNNING, RunStatus.WAITING)
FINISHED = tuple(status for status in RunStatus if status not in UNFINISHED)  # pruned past retention


class StepStatus(models.TextChoices):
    PENDING = "pending"
    DONE = "done"
    SKIPPED = "skipped"
    WAITING = "waiting"


class WorkflowRunQuerySet(ModeOwnedQuerySet):
    def unfinished(self) -> WorkflowRunQuerySet:
        return self.filter(status__in=UNFINISHED)


class WorkflowRun(TenantOwned):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # A hot table (a fan-out writes tens of thousands of runs a second for one tenant and workflow): no
    # database-level foreign keys, and no index on tenant alone (the indexes below lead with it).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="runs", db_index=False, **HOT_FK)
    subscriber = models.CharField(max_length=200)  # the external id ("" for a sequence's enrollment)
    # A sequence's enrollment sends to one recipient, not a subscriber: stored encrypted, masked beside.
    recipient = EncryptedTextField(null=True, blank=True)
    recipient_masked = models.CharField(max_length=200, blank=True, default="", db_default="")
    starts_at = models.DateTimeField(null=True, blank=True)  # an enrollment's: its steps' offsets count from it
    trigger_id = models.UUIDField()
    # running: its next step is due (a scheduler takes it); waiting: on a delay or a digest window
    status = models.CharField(max_length=10, choices=RunStatus.choices, default=RunStatus.RUNNING)
    cancellation_key = models.CharField(max_length=200, null=True, blank=True)
    actor = models.CharField(max_length=200, null=True, blank=True)
    data = models.JSONField(default=dict, blank=True, null=True)  # NULL: its fan-out's (resolve_runs)
    # The workflow's steps and category as they were at the trigger: a run follows the definition it began with.
    definition = models.JSONField(default=list, null=True)  # NULL: its fan-out's
    category = models.CharField(max_length=100, default="general")
    step_index = models.PositiveSmallIntegerField(default=0)
    # [{name, type, status, notification_id, at, reason}]; NULL: the definition's, all pending
    steps = models.JSONField(default=list, null=True)
    digest = models.JSONField(null=True, blank=True)  # {count, items} once a digest step let this run go on
    # The scheduled job this run waits on (kind `workflow`; `workflow_share`, shared, a fan-out's); None once finished.
    wake_id = models.UUIDField(null=True, blank=True)
    # The database's clock: a digest window opens at its first trigger's created_at.
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # Test data (created with a test key): seen by test keys only, sent to the simulator.
    test = models.BooleanField(default=False, db_default=False)

    objects = WorkflowRunQuerySet.as_manager()

    class Meta:
        db_table = "workflow_runs"
        ordering = ["-created_at", "-id"]
        indexes = [
            # GET workflow-runs: a tenant's newest first, cursor on (created_at, id).
            models.Index(fields=["tenant", "-created_at", "-id"], name="workflow_run_recent_idx"),
            # the runs waiting on a job (GET workflow-runs?trigger_id= uses the unique key below)
            models.Index(fields=["wake_id"], name="workflow_run_wake_idx", condition=Q(wake_id__isnull=False)),
            # POST workflows/{key}/cancel: the unfinished runs of a workflow with a cancellation key.
            models.Index(fields=["tenant", "workflow", "cancellation_key"], name="workflow_run_cancel_idx",
                         condition=Q(status__in=["running", "waiting"], cancellation_key__isnull=False)),
        ]  # fmt: skip
        constraints = [
            # one run per subscriber and trigger: a topic fan-out's chunk repeated after a crash adds nothing
            models.UniqueConstraint(fields=["trigger_id", "subscriber"], name="workflow_run_one_per_trigger"),
        ]

    def __str__(self) -> str:
        return f"run {self.id} of {self.workflow_id} for {self.subscriber} ({self.status})"


def initial_states(definition: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's step states before its first step: every step pending."""
    return [{"name": s["name"], "type": s["type"], "status": "pending", "notification_id": None, "at": None,
             "reason": None} for s in definition]  # fmt: skip


def resolve_runs(runs: Iterable[WorkflowRun], *, using: str | None = None) -> None:
    """Fill in memory what fan-out runs leave NULL (data, definition, steps) from their fan-outs
    (one query, only when some run needs it)."""
    wanted = [run for run in runs if run.data is None or run.definition is None or run.steps is None]
    if not wanted:
        return
    rows = Fanout.objects.using(using or Fanout.objects.db).filter(pk__in={run.trigger_id for run in wanted})
    # one object each per fan-out, shared by its runs (read only: a walk changes copies of the states)
    fanouts = {pk: (data, definition, initial_states(definition))
               for pk, data, definition in rows.values_list("pk", "data", "definition")}  # fmt: skip
    for run in wanted:
        data, definition, states = fanouts.get(run.trigger_id, ({}, [], []))
        if run.data is None:
            run.data = data
        if run.definition is None:
            run.definition = definition
        if run.steps is None:
            run.steps = states if definition is run.definition else initial_states(run.definition)


class WorkflowThrottle(TenantOwned):
    """A throttle step's current window for one subscriber and key (workflows.statements)."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+", db_index=False)
    step = models.CharField(max_length=100)
    subscriber = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="")
    window_start = models.DateTimeField()
    count = models.PositiveIntegerField()

    class Meta:
        db_table = "workflow_throttles"
        constraints = [
            # the throttle's upsert (ON CONFLICT) and its one row per subscriber and key
            models.UniqueConstraint(fields=["tenant", "workflow", "step", "subscriber", "key"],
                                    name="workflow_throttle_unique"),
        ]  # fmt: skip


class WorkflowDigest(TenantOwned):
    """A digest step's window for one subscriber and key: its joined triggers' count and first items."""

    class Status(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+", db_index=False)
    step = models.CharField(max_length=100)
    subscriber = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=6, choices=Status.choices, default=Status.OPEN)
    opened_at = models.DateTimeField()
    closes_at = models.DateTimeField()
    leader_id = models.UUIDField()  # the run that goes on when the window closes
    count = models.PositiveIntegerField()
    items = models.JSONField(default=list)  # the data of the oldest 100 joined triggers, oldest first
    # each item's trigger time in µs since the epoch, in step with `items` (workflows.statements); an
    # item the version before appended (during an upgrade) has none and takes the time of the one before
    item_stamps = models.JSONField(db_default=Value([], output_field=models.JSONField()))

    class Meta:
        db_table = "workflow_digests"
        constraints = [
            # one open window per subscriber and key: the join's UPDATE and the open's ON CONFLICT
            models.UniqueConstraint(fields=["tenant", "workflow", "step", "subscriber", "key"],
                                    condition=Q(status="open"), name="workflow_digest_one_open"),
        ]  # fmt: skip
        indexes = [
            # the leader's close: WHERE leader_id = … AND step = …
            models.Index(fields=["leader_id"], name="workflow_digest_leader_idx"),
        ]


class Fanout(TenantOwned):
    """A workflow trigger to a topic, fanning out (workflows.fanout): the runs are created in chunks of
    the topic's members in id order, each chunk one transaction that also moves `cursor` (the last
    member id done) and `created`, so a fan-out resumes from its last committed chunk after any crash.
    `boundary` fixes who was a member at the trigger (recipients.topics)."""

    class Status(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        CANCELLED = "cancelled"  # by staff or a cancel of its cancellation_key: no more chunks

    id = models.UUIDField(primary_key=True, editable=False)  # the trigger_id of its runs
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+", db_index=False)
    topic_id = models.BigIntegerField()  # recipients' Topic: no constraint, the topic may go once done
    topic_key = models.CharField(max_length=100)
    boundary = models.BigIntegerField()
    cursor = models.BigIntegerField(default=0)
    total = models.BigIntegerField()  # members at the trigger (the 202's `runs`)
    created = models.BigIntegerField(default=0)  # runs created so far
    chunks = models.IntegerField(default=0)  # chunks committed so far
    last_read = models.IntegerField(default=0)  # members the last chunk read (fewer than a chunk: done)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    data = models.JSONField(default=dict, blank=True)
    cancellation_key = models.CharField(max_length=200, null=True, blank=True)
    actor = models.CharField(max_length=200, null=True, blank=True)
    # The workflow's steps and category at the trigger: every chunk's runs follow the same definition.
    definition = models.JSONField(default=list)
    category = models.CharField(max_length=100, default="general")
    test = models.BooleanField(default=False, db_default=False)  # a test key's trigger: its runs are test data
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "workflow_fanouts"
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status"], name="workflow_fanout_running_idx", condition=Q(status="running")),
        ]
        permissions = [("cancel_fanout", "Can cancel a fan-out")]

    def __str__(self) -> str:
        return f"fan-out {self.id} of {self.workflow_id} to topic {self.topic_key} ({self.status})"

    def stop(self, *, using: str = "default") -> bool:
        """Running -> cancelled: no further chunk is fanned out (the runs made stay). False when it had
        finished already (or a peer stopped it first)."""
        running = Fanout.objects.using(using).filter(pk=self.pk, status=Fanout.Status.RUNNING)
        return running.update(status=Fanout.Status.CANCELLED, finished_at=Now()) == 1


class FanoutCancel(models.Model):
    """A member of a running fan-out's topic named by a cancel before the fan-out reached them: the
    chunk that reaches them creates their run `cancelled` (workflows.statements.fan_out_chunk), so
    they still have exactly one run and it never takes a step."""

    fanout = models.ForeignKey(Fanout, on_delete=models.CASCADE, related_name="+", db_index=False)
    subscriber = models.CharField(max_length=200)  # the external id

    class Meta:
        db_table = "workflow_fanout_cancels"
        constraints = [
            # a chunk's lookup of each member (fanout_id, subscriber), and a repeated cancel adds nothing
            models.UniqueConstraint(fields=["fanout", "subscriber"], name="workflow_fanout_cancel_once"),
        ]

    def __str__(self) -> str:
        return f"{self.subscriber} cancelled ahead of fan-out {self.fanout_id}"
