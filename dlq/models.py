"""The dead-letter queue: notifications that failed permanently or ran out of attempts."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from core.models import ModeOwnedQuerySet, TenantOwned


class FailureClass(models.TextChoices):
    TRANSIENT = "transient"
    PERMANENT = "permanent"


class DeadLetterQuerySet(ModeOwnedQuerySet):
    def open(self) -> DeadLetterQuerySet:
        return self.filter(status=DeadLetter.Status.OPEN)


class DeadLetter(TenantOwned):
    class Status(models.TextChoices):
        OPEN = "open"
        REDRIVEN = "redriven"
        DISCARDED = "discarded"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    notification = models.ForeignKey(
        "notifications.Notification", on_delete=models.CASCADE, related_name="dead_letters"
    )
    provider = models.ForeignKey(
        "providers.Provider", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    failure_class = models.CharField(max_length=10, choices=FailureClass.choices)
    failure_reason = models.TextField()
    error_code = models.CharField(max_length=100, blank=True, default="")
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    attempt_count = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    created_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=200, blank=True, default="")
    # Test data (created with a test key): seen by test keys only, sent to the simulator.
    test = models.BooleanField(default=False, db_default=False)

    objects = DeadLetterQuerySet.as_manager()

    class Meta:
        db_table = "dead_letter_queue"
        verbose_name = "dead letter"
        constraints = [
            models.UniqueConstraint(
                fields=["notification"], condition=Q(status="open"), name="dlq_one_open_entry_per_notification"
            ),
        ]
        indexes = [
            # GET dlq / admin list: a tenant's entries by status, newest first.
            models.Index(fields=["tenant", "status", "-created_at"], name="dlq_tenant_status_idx"),
            models.Index(fields=["status", "-created_at"], name="dlq_status_recent_idx"),
            # The console's list with "All" statuses: every entry, newest first (superusers / one tenant).
            models.Index(fields=["-created_at", "-id"], name="dlq_console_recent_idx"),
            models.Index(fields=["tenant", "-created_at", "-id"], name="dlq_console_tenant_idx"),
        ]
        permissions = [("redrive_deadletter", "Can redrive and discard dead letters")]

    def __str__(self) -> str:
        return f"{self.failure_class} failure of {self.notification_id} ({self.status})"
