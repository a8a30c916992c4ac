"""Dead-letter serializers: entries (list and detail), the list filters and the bulk redrive body.

Responses are built by hand in `to_representation` (explicit fields, no extra queries); the
declared fields describe them in the OpenAPI schema.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.schema import (
    FullRegexField,
    StrictBooleanField,
    StrictFloatField,
    StrictIntegerField,
    StrictRegexField,
    StrictSerializer,
    iso,
)
from core.masking import mask_text
from core.validation import NAME, parse_aware_datetime
from dlq.models import DeadLetter, FailureClass
from notifications.api.serializers import AttemptSerializer
from notifications.models import Status

MAX_BULK_LIMIT = 10_000
DEFAULT_BULK_LIMIT = 1_000


@extend_schema_field({"type": "string", "enum": DeadLetter.Status.values}, component_name="DeadLetterStatus")
class DeadLetterStatusField(serializers.ChoiceField):
    """Its own enum component: `status` of notifications is another set of values."""


class DeadLetterSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    notification_id = serializers.UUIDField()
    provider = serializers.CharField(allow_null=True, help_text="Provider name at the time of the failure.")
    failure_class = serializers.ChoiceField(choices=FailureClass.choices)
    failure_reason = serializers.CharField(help_text="Error code and message; never a recipient or secret.")
    error_code = serializers.CharField()
    last_status_code = serializers.IntegerField(allow_null=True, help_text="HTTP status of the last attempt.")
    attempt_count = serializers.IntegerField(help_text="Attempts made when the entry was opened.")
    status = DeadLetterStatusField(choices=DeadLetter.Status.choices)
    created_at = serializers.DateTimeField()
    resolved_at = serializers.DateTimeField(allow_null=True)
    resolved_by = serializers.CharField(help_text="Who redrove or discarded it: api_key:<prefix>, user:<name>, …")

    def to_representation(self, d: DeadLetter) -> dict[str, Any]:
        return {
            "id": str(d.id), "notification_id": str(d.notification_id),
            "provider": d.provider.name if d.provider_id is not None else None,
            "failure_class": d.failure_class, "failure_reason": mask_text(d.failure_reason),
            "error_code": d.error_code, "last_status_code": d.last_status_code, "attempt_count": d.attempt_count,
            "status": d.status, "created_at": iso(d.created_at), "resolved_at": iso(d.resolved_at),
            "resolved_by": d.resolved_by,
        }  # fmt: skip


class DeadLetterDetailSerializer(DeadLetterSerializer):
    channel = serializers.CharField(help_text="The notification's channel.")
    recipient_masked = serializers.CharField(help_text="The recipient, masked: j***@example.com, +1******4567.")
    notification_status = serializers.CharField(
        help_text=f"The notification's status now: {', '.join(Status.values)}."
    )
    attempts = AttemptSerializer(many=True, help_text="Every delivery attempt of the notification, in order.")

    def to_representation(self, d: DeadLetter) -> dict[str, Any]:
        data = super().to_representation(d)
        note = d.notification
        data.update(
            channel=note.channel,
            recipient_masked=note.recipient_masked,
            notification_status=note.status,
            attempts=[AttemptSerializer().to_representation(a) for a in self.context.get("attempts", [])],
        )
        return data


def _choice(data: Any, name: str, choices: list[str], clean: dict, errors: dict) -> None:
    if name in data and data[name] is not None:
        if data[name] in choices:
            clean[name] = data[name]
        else:
            errors[name] = [f"must be one of {', '.join(choices)}"]


def _common_filters(data: Any, clean: dict, errors: dict) -> None:
    _choice(data, "failure_class", FailureClass.values, clean, errors)
    if data.get("provider") is not None:
        if isinstance(data["provider"], str) and NAME.fullmatch(data["provider"]):
            clean["provider"] = data["provider"]
        else:
            errors["provider"] = ["must be a provider name (letters, digits, - and _)"]
    if data.get("created_after") is not None:
        try:
            clean["created_after"] = parse_aware_datetime(data["created_after"])
        except ValueError as exc:
            errors["created_after"] = [str(exc)]


class DeadLetterFilterSerializer(serializers.Serializer):
    failure_class = serializers.ChoiceField(choices=FailureClass.choices, required=False)
    status = DeadLetterStatusField(choices=DeadLetter.Status.choices, required=False)
    provider = FullRegexField(NAME.pattern, required=False, help_text="Provider name.")
    created_after = serializers.DateTimeField(required=False, help_text="ISO 8601 with a UTC offset.")

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        errors: dict[str, list[str]] = {}
        clean: dict[str, Any] = {}
        _choice(data, "status", DeadLetter.Status.values, clean, errors)
        _common_filters(data, clean, errors)
        if errors:
            raise serializers.ValidationError(errors)
        return clean


class BulkRedriveSerializer(StrictSerializer):
    failure_class = serializers.ChoiceField(choices=FailureClass.choices, required=False, allow_null=True)
    provider = StrictRegexField(NAME.pattern, required=False, allow_null=True)
    created_after = serializers.DateTimeField(required=False, allow_null=True, help_text="ISO 8601 with a UTC offset.")
    limit = StrictIntegerField(
        required=False, min_value=1, max_value=MAX_BULK_LIMIT, default=DEFAULT_BULK_LIMIT,
        help_text=f"Redrive at most this many open entries, oldest first (default {DEFAULT_BULK_LIMIT:,}, "
        f"at most {MAX_BULK_LIMIT:,} per request; for more use `manage.py dlq_redrive`).",
    )  # fmt: skip
    rate = StrictFloatField(
        required=False, allow_null=True, min_value=0.001,
        help_text="Entries per second: the re-queued notifications become ready spread over time "
        "(the n-th after n/rate seconds), so a recovering provider is not flooded. Default: all at once.",
    )  # fmt: skip
    dry_run = StrictBooleanField(
        required=False, default=False, help_text="Only count: answers {redriven: 0, would_redrive: n}."
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object"]})
        clean = {k: v for k, v in super().to_internal_value(data).items() if v is not None}
        if data.get("created_after") is not None:  # DRF would accept a naive time; OmniPost wants the offset
            try:
                clean["created_after"] = parse_aware_datetime(data["created_after"])
            except ValueError as exc:
                raise serializers.ValidationError({"created_after": [str(exc)]}) from None
        return clean


class BulkRedriveResultSerializer(serializers.Serializer):
    redriven = serializers.IntegerField(help_text="Entries redriven (0 on a dry run).")
    refused = serializers.IntegerField(help_text="Entries that changed state meanwhile and were left alone.")
    would_redrive = serializers.IntegerField(required=False, help_text="Dry run only: entries that match.")
    dry_run = serializers.BooleanField()
