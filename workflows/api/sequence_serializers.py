"""Serializers for drip sequences and their enrollments.

Requests refuse unknown fields and values of the wrong JSON type; checks that need the tenant's
data (templates, providers, the recipient against each step's channel) run in
`workflows.sequences`. Responses are built by hand; the declared fields document them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.schema import StrictCharField, StrictIntegerField, StrictRegexField, StrictSerializer, iso
from core.channels import Channel
from core.validation import MAX_METADATA_BYTES, MAX_TOKEN_CHARS, NAME, check_name, check_object
from notifications import validation
from notifications.models import Notification, Status
from workflows.models import RunStatus, Workflow, WorkflowRun
from workflows.sequences import MAX_STEPS, StepSpec, check_step_channels, planned, step_errors, step_position

MAX_OFFSET_SECONDS = int(validation.MAX_SCHEDULE_AHEAD.total_seconds())


# --- sequences ------------------------------------------------------------------------------------


class SequenceStepSerializer(StrictSerializer):
    position = serializers.IntegerField(read_only=True, help_text="The step's index in `steps`, from 0.")
    offset_seconds = StrictIntegerField(
        min_value=0, max_value=MAX_OFFSET_SECONDS,
        help_text="Seconds after the enrollment's `starts_at`; at least the previous step's offset.",
    )  # fmt: skip
    channel = serializers.ChoiceField(choices=Channel.choices)
    template = StrictRegexField(NAME.pattern, max_length=100, help_text="Key of a template of this channel.")


class SequenceSerializer(StrictSerializer):
    key = StrictRegexField(NAME.pattern, max_length=100, help_text="Unique per tenant; names the sequence.")
    name = StrictCharField(required=False, allow_blank=True, max_length=200, default="")
    steps = serializers.ListField(
        child=SequenceStepSerializer(), min_length=1, max_length=MAX_STEPS,
        help_text=f"1 to {MAX_STEPS} steps, in order. Every step takes the same recipient format: all email, all "
        "sms, or push/webhook tokens (one enrollment has one recipient).",
    )  # fmt: skip
    created_at = serializers.DateTimeField(read_only=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs["steps"] = [StepSpec(**step) for step in attrs["steps"]]
        errors = check_step_channels(attrs["steps"])
        if errors:
            raise step_errors(errors)
        return attrs

    def to_representation(self, s: Workflow) -> dict[str, Any]:
        return {
            "key": s.key,
            "name": s.name,
            "steps": [
                {"position": send.position, "offset_seconds": send.offset_seconds, "channel": send.step["channel"],
                 "template": send.step["template"]}  # fmt: skip
                for send in planned(s.steps)
            ],
            "created_at": iso(s.created_at),
        }


# --- enrollments ----------------------------------------------------------------------------------


@extend_schema_field({"type": "string", "format": "date-time"})
class AwareDateTimeField(serializers.Field):
    """ISO 8601 with a UTC offset (a naive date-time is refused, not guessed)."""

    def to_internal_value(self, data: Any) -> datetime:
        try:
            return validation.check_scheduled_for(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "pattern": NAME.pattern},
            {"type": "object", "additionalProperties": False,
             "properties": {c: {"type": "string", "pattern": NAME.pattern} for c in Channel.values}},
        ],
        "description": "A provider name for every step, or {channel: provider name}; a channel left out uses "
        "the tenant's default provider for it.",
    }
)
class ProviderChoiceField(serializers.Field):
    def to_internal_value(self, data: Any) -> str | dict[str, str]:
        try:
            if isinstance(data, dict):
                unknown = [c for c in data if c not in Channel.values]
                if unknown:
                    raise ValueError(f"unknown channel(s) {', '.join(map(repr, unknown))}; use {', '.join(Channel)}")
                return {channel: check_name(name) for channel, name in data.items()}
            return check_name(data)
        except ValueError as exc:
            message = f"must be a provider name or an object of channel → provider name: {exc}"
            raise serializers.ValidationError(message) from None


class ContextField(serializers.DictField):
    def to_internal_value(self, data: Any) -> dict[str, Any]:
        try:
            return check_object(data, MAX_METADATA_BYTES)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class EnrollmentCreateSerializer(StrictSerializer):
    recipient = StrictCharField(
        min_length=1, max_length=MAX_TOKEN_CHARS, trim_whitespace=False,
        help_text="Checked against every step's channel (email: RFC 5322 addr-spec; sms: E.164; push/webhook: "
        "1–4096 characters without control characters). Stored encrypted, returned only as `recipient_masked`.",
    )  # fmt: skip
    context = ContextField(required=False, default=dict, help_text="Template variables for every step (≤ 4 KiB).")
    starts_at = AwareDateTimeField(
        required=False, allow_null=True, default=None,
        help_text="ISO 8601 with a UTC offset; default now. Step n runs at starts_at + offset_seconds; a step "
        "already due is queued at once.",
    )  # fmt: skip
    provider = ProviderChoiceField(required=False, allow_null=True, default=None)


class EnrollmentStepSerializer(serializers.Serializer):
    position = serializers.IntegerField()
    channel = serializers.ChoiceField(choices=Channel.choices)
    notification_id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=Status.choices)
    scheduled_for = serializers.DateTimeField()


class EnrollmentSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    sequence = serializers.CharField(help_text="The sequence's key.")
    recipient_masked = serializers.CharField()
    context = serializers.DictField()
    starts_at = serializers.DateTimeField()
    state = serializers.ChoiceField(choices=[("active", "active"), ("cancelled", "cancelled")])
    created_at = serializers.DateTimeField()
    cancelled_at = serializers.DateTimeField(allow_null=True)
    steps = EnrollmentStepSerializer(many=True, help_text="One notification per step, in step order.")

    def to_representation(self, e: WorkflowRun) -> dict[str, Any]:
        """An enrollment is a run of the sequence's workflow: cancelled once removed, else active."""
        notes: list[Notification] = sorted(e.step_notifications, key=step_position)  # type: ignore[attr-defined]
        cancelled = e.status == RunStatus.CANCELLED
        return {
            "id": str(e.id), "sequence": e.workflow.key, "recipient_masked": e.recipient_masked,
            "context": e.data, "starts_at": iso(e.starts_at), "state": "cancelled" if cancelled else "active",
            "created_at": iso(e.created_at), "cancelled_at": iso(e.updated_at) if cancelled else None,
            "steps": [
                {"position": step_position(n), "channel": n.channel, "notification_id": str(n.id),
                 "status": n.live_status, "scheduled_for": iso(n.scheduled_for)}
                for n in notes
            ],
        }  # fmt: skip
