"""Bulk sends: a CSV file of recipients (or subscribers) and template variables, validated whole when
uploaded, then turned into one notification per row by the scheduler, a chunk at a time.

`BulkSend` is the job; `BulkSendChunk` holds its validated rows, `CHUNK_ROWS` to a chunk, encrypted
as one token each (recipients are stored only encrypted), until the chunk's notifications exist, and
then the chunk's counts once they all finished. Through a workflow a row becomes a run instead: the
runs' trigger id is the job's id, one run per subscriber (bulk.csvfile refuses a subscriber named
twice). A
chunk is what the scheduler creates in one transaction (bulk.engine), and its id is the opaque id of
the scheduled job (kind `bulk_send`) that creates it."""

from __future__ import annotations

from django.db import models

from core.fields import EncryptedJSONField
from core.ids import uuid7
from core.models import ModeOwnedQuerySet, TenantOwned
from templating.models import Template
from workflows.models import Workflow

CHUNK_ROWS = 1000  # rows a chunk holds and the scheduler creates per transaction
MAX_ROWS = 100_000
MAX_BYTES = 20 * 1024 * 1024
MAX_ERRORS = 100  # errors a job keeps and shows (it counts them all)


class BulkStatus(models.TextChoices):
    INVALID = "invalid"  # some row has an error: it can never start (upload a fixed file)
    READY = "ready"  # every row is valid: `start` sends it
    SENDING = "sending"  # started: its chunks are being created (from `scheduled_for`, if given)
    COMPLETED = "completed"  # every row's notification exists
    CANCELLED = "cancelled"  # rows not created by then never will be


class BulkSend(TenantOwned):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # A test key's jobs (`test`) are seen by test keys only, a live key's by live ones (for_tenant).
    objects = ModeOwnedQuerySet.as_manager()
    name = models.CharField(max_length=200, blank=True, default="")
    channel = models.CharField(max_length=10, blank=True)  # "" through a workflow
    # Each row is rendered with `template`, or starts one run of `workflow` (the other is NULL).
    template = models.ForeignKey(Template, on_delete=models.PROTECT, related_name="+", db_index=False, null=True)
    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="+", db_index=False, null=True)
    # `recipient` (an address per row) or `subscriber` (an external id per row)
    addressed_by = models.CharField(max_length=10)
    columns = models.JSONField(default=list)  # the header, as uploaded
    status = models.CharField(max_length=10, choices=BulkStatus.choices)
    rows = models.PositiveIntegerField(default=0)
    errors = models.JSONField(default=list)  # the first MAX_ERRORS: [{row, column, message}]
    error_count = models.PositiveIntegerField(default=0)
    scheduled_for = models.DateTimeField(null=True, blank=True)  # when its rows start to be created
    # Rows done (1..rows_done): their notifications exist, or they were skipped; written with each chunk.
    rows_done = models.PositiveIntegerField(default=0)
    # Rows that could not become a notification when their chunk ran (their subscriber lost its address
    # since the upload, say): counted as failed, their first messages appended to `errors`.
    skipped = models.PositiveIntegerField(default=0)
    # {delivered, failed, suppressed} once every notification finished: later reads cost nothing.
    final_counts = models.JSONField(null=True, blank=True)
    test = models.BooleanField(default=False, db_default=False)  # created with a test key
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "bulk_sends"
        permissions = [("cancel_bulksend", "Can cancel a bulk send")]
        indexes = [models.Index(fields=["tenant", "-created_at", "-id"], name="bulk_send_tenant_recent_idx")]

    def __str__(self) -> str:
        return self.name or str(self.id)


class BulkSendChunk(TenantOwned):
    """CHUNK_ROWS rows of a job: their checked values until their notifications exist (`payload`, one
    Fernet token; NULL from then on), then their counts once every one of those notifications finished
    (`settled`), so a job's progress reads the notifications of its unsettled chunks only."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    bulk_send = models.ForeignKey(BulkSend, on_delete=models.CASCADE, related_name="chunks", db_index=False)
    first_row = models.PositiveIntegerField()  # 1-based data row of its first row
    last_row = models.PositiveIntegerField()
    # [[recipient or external id, {column: value}], …]
    payload = EncryptedJSONField(null=True)
    settled = models.BooleanField(default=False)
    delivered = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)  # failed, dead-lettered or cancelled
    suppressed = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "bulk_send_chunks"
        constraints = [models.UniqueConstraint(fields=["bulk_send", "first_row"], name="bulk_chunk_unique")]

    def __str__(self) -> str:
        return f"rows {self.first_row}-{self.last_row} of {self.bulk_send_id}"
