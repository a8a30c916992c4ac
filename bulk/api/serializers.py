"""A bulk send's JSON (built without serializer instances) and its schema."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from bulk import services
from bulk.models import BulkSend, BulkStatus
from core.api.schema import iso


class BulkUploadSerializer(serializers.Serializer):
    """For the schema: bulk.services.clean_options checks the fields."""

    file = serializers.FileField(required=False, help_text="The CSV file (multipart/form-data).")
    csv = serializers.CharField(required=False, help_text="The CSV text (JSON).")
    channel = serializers.CharField(required=False, help_text="With `template`.")
    template = serializers.CharField(required=False, help_text="The template's key (or `workflow`).")
    workflow = serializers.CharField(
        required=False, help_text="A workflow's key: each row (header `subscriber` and any data columns) is one run."
    )
    scheduled_for = serializers.DateTimeField(required=False, help_text="When its rows start to be sent.")
    name = serializers.CharField(required=False)


class RowErrorSerializer(serializers.Serializer):
    row = serializers.IntegerField(help_text="1-based data row (the header not counted).")
    column = serializers.CharField(allow_null=True, help_text="The header's name of the column.")
    message = serializers.CharField()


class ProgressSerializer(serializers.Serializer):
    created = serializers.IntegerField(help_text="Rows whose notification (through a workflow: run) exists.")
    delivered = serializers.IntegerField(help_text="Delivered notifications; through a workflow, completed runs.")
    failed = serializers.IntegerField(
        help_text="Failed, dead-lettered or cancelled, and rows that could not be created; through a workflow, "
        "failed or cancelled runs."
    )
    suppressed = serializers.IntegerField(help_text="Through a workflow: throttled or digested runs.")
    pending = serializers.IntegerField(help_text="Created, not finished yet.")


class BulkSendSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    channel = serializers.CharField(allow_null=True)
    template = serializers.CharField(allow_null=True)
    workflow = serializers.CharField(allow_null=True, help_text="The workflow's key, for a job of runs.")
    status = serializers.ChoiceField(choices=BulkStatus.choices)
    rows = serializers.IntegerField()
    errors = RowErrorSerializer(many=True, help_text="The first 100 errors, by row.")
    error_count = serializers.IntegerField()
    scheduled_for = serializers.DateTimeField(allow_null=True)
    test = serializers.BooleanField()
    progress = ProgressSerializer(required=False, help_text="In a single bulk send's answers.")
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    cancelled_at = serializers.DateTimeField(allow_null=True)


def bulk_data(bulk: BulkSend, *, with_progress: bool = False) -> dict[str, Any]:
    when = iso
    data = {
        "id": str(bulk.pk), "name": bulk.name, "channel": bulk.channel or None,
        "template": bulk.template.key if bulk.template else None,
        "workflow": bulk.workflow.key if bulk.workflow else None,
        "status": bulk.status, "rows": bulk.rows, "errors": bulk.errors, "error_count": bulk.error_count,
        "scheduled_for": when(bulk.scheduled_for), "test": bulk.test, "created_at": when(bulk.created_at),
        "started_at": when(bulk.started_at), "completed_at": when(bulk.completed_at),
        "cancelled_at": when(bulk.cancelled_at),
    }  # fmt: skip
    if with_progress:
        data["progress"] = services.progress(bulk)
    return data
