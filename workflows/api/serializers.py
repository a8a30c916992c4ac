"""A workflow as a tenant defines it (`key`, `name`, `category`, `steps`) and a run as it reads
(`{id, workflow, subscriber, trigger_id, status, steps, created_at}`). `key` is fixed once created."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.schema import StrictCharField, StrictModelSerializer, StrictRegexField, StrictSerializer, refuse_changes
from core.validation import NAME
from workflows.models import RunStatus, Workflow, WorkflowRun
from workflows.steps import clean_steps


class StepsField(serializers.JSONField):
    """Up to 20 steps, each `{name, type, …its fields}` (send, delay, digest, throttle)."""

    def to_internal_value(self, data: Any) -> Any:  # noqa: ANN401
        try:
            return clean_steps(data)
        except serializers.ValidationError as exc:
            detail = exc.detail.get("steps") if isinstance(exc.detail, dict) else exc.detail
            raise serializers.ValidationError(detail) from None


class WorkflowSerializer(StrictModelSerializer):
    key = StrictRegexField(NAME.pattern, max_length=100)
    name = StrictCharField(required=False, allow_blank=True, max_length=200)
    category = StrictRegexField(NAME.pattern, max_length=100, required=False)
    steps = StepsField()

    class Meta:
        model = Workflow
        fields = ["key", "name", "category", "steps", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_changes(self.instance, attrs, ("key",))
        return attrs


class RunStepSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(choices=["send", "delay", "digest", "throttle"])
    status = serializers.ChoiceField(choices=["pending", "done", "skipped", "waiting"])
    notification_id = serializers.UUIDField(allow_null=True)
    at = serializers.DateTimeField(allow_null=True, help_text="When a waiting step resumes.")
    reason = serializers.CharField(allow_null=True, help_text="Why a step was skipped (e.g. no_address).")


class WorkflowRunSerializer(serializers.ModelSerializer):
    workflow = serializers.SlugRelatedField(slug_field="key", read_only=True)
    status = serializers.ChoiceField(choices=RunStatus.choices, read_only=True)
    steps = serializers.SerializerMethodField()

    class Meta:
        model = WorkflowRun
        fields = ["id", "workflow", "subscriber", "trigger_id", "status", "steps", "created_at"]
        read_only_fields = fields

    def get_steps(self, run: WorkflowRun) -> list[dict[str, Any]]:
        return [
            {"name": s.get("name"), "type": s.get("type"), "status": s.get("status"),
             "notification_id": s.get("notification_id"), "at": s.get("at"), "reason": s.get("reason")}
            for s in run.steps
        ]  # fmt: skip


RunStepsSchema = RunStepSerializer(many=True)


class RunFilterSerializer(StrictSerializer):
    workflow = StrictRegexField(NAME.pattern, max_length=100, required=False)
    subscriber = StrictCharField(max_length=200, required=False)
    status = serializers.ChoiceField(choices=RunStatus.choices, required=False)
    trigger_id = serializers.UUIDField(required=False)


class TriggerSerializer(serializers.Serializer):
    """For the schema: the body is checked by workflows.services.clean_trigger."""

    subscribers = serializers.ListField(child=serializers.CharField(max_length=200), min_length=1, max_length=1000,
                                        required=False, help_text="1 to 1,000 external ids; or `topic`.")
    topic = serializers.RegexField(NAME.pattern, max_length=100, required=False,
                                   help_text="A topic's key: one run per member at the trigger (but `actor`).")
    data = serializers.DictField(required=False, help_text="The template context's `data` (≤ 32 KiB as compact JSON).")
    cancellation_key = serializers.CharField(required=False, max_length=200)
    actor = serializers.CharField(required=False, max_length=200,
                                  help_text="The subscriber who caused the trigger; left out of a topic's fan-out.")


class TriggerResultSerializer(serializers.Serializer):
    trigger_id = serializers.UUIDField()
    runs = serializers.IntegerField()


class CancelSerializer(StrictSerializer):
    cancellation_key = StrictCharField(max_length=200)
    subscribers = serializers.ListField(child=StrictCharField(max_length=200), required=False, max_length=1000)


class CancelResultSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField()
