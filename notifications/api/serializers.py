"""Notification and scheduled-job serializers.

Request bodies are checked by `notifications.validation` (plain functions, fast for 1,000-item
batches); the fields declared here document the same rules in the OpenAPI schema. Responses are
built by hand in `to_representation` for the same reason; the declared fields describe them.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from core.api.schema import FullRegexField, StrictSerializer, iso
from core.channels import Channel
from core.validation import MAX_BODY_CHARS, MAX_SUBJECT_CHARS, MAX_TOKEN_CHARS, NAME, FieldErrors, parse_aware_datetime
from notifications import reads, validation
from notifications.models import AttemptOutcome, BounceType, Notification, ReceiptStatus, Status
from queueing.models import ScheduledJob
from recipients.services import MAX_EXTERNAL_ID_CHARS

# --- requests -------------------------------------------------------------------------------------


class FallbackStepSerializer(StrictSerializer):
    channel = serializers.ChoiceField(
        choices=validation.FALLBACK_CHANNELS, help_text="Another channel than the notification's."
    )
    after_seconds = serializers.IntegerField(min_value=0, max_value=validation.MAX_FALLBACK_SECONDS)


class NotificationCreateSerializer(StrictSerializer):
    channel = serializers.ChoiceField(choices=Channel.choices)
    recipient = serializers.CharField(
        min_length=1, max_length=MAX_TOKEN_CHARS, required=False,
        help_text="email: RFC 5322 addr-spec; sms: E.164 (+15551234567); push/webhook: 1–4096 characters "
        "without control characters. Stored encrypted, returned only as `recipient_masked`. "
        "Required unless `subscriber` is given.",
    )  # fmt: skip
    subscriber = serializers.CharField(
        min_length=1, max_length=MAX_EXTERNAL_ID_CHARS, required=False,
        help_text="A subscriber's external_id instead of `recipient`: its address for the channel is used "
        "(push: its first token; not for the webhook channel).",
    )  # fmt: skip
    category = FullRegexField(
        NAME.pattern, required=False, default="general",
        help_text="A category key of the tenant (default `general`); opt-outs and suppressions are per category.",
    )  # fmt: skip
    provider = FullRegexField(
        NAME.pattern, required=False, allow_null=True,
        help_text="Provider name; default: the tenant's default provider for the channel.",
    )  # fmt: skip
    subject = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, max_length=MAX_SUBJECT_CHARS
    )
    body = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, max_length=MAX_BODY_CHARS,
        help_text="Required unless `template` is given.",
    )  # fmt: skip
    template = FullRegexField(
        NAME.pattern, required=False, allow_null=True,
        help_text="Template key; renders subject and body from `context` (not with subject/body).",
    )  # fmt: skip
    context = serializers.DictField(required=False, allow_null=True, help_text="Template variables (≤ 64 KiB).")
    locale = serializers.CharField(
        required=False, allow_null=True, max_length=35,
        help_text="BCP 47 tag (with `template`): the variant to render. Fallback: this tag, the subscriber's "
        "`locale`, then each one's base language (fr-CA → fr), then the template's own fields.",
    )  # fmt: skip
    priority = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=9, default=5)
    queue = FullRegexField(validation.QUEUE_NAME.pattern, required=False, allow_null=True, default="default")
    scheduled_for = serializers.DateTimeField(
        required=False, allow_null=True,
        help_text="ISO 8601 with a UTC offset; in the future the notification is scheduled, else queued now "
                  "(or scheduled for the end of the recipient's quiet hours, when it is created inside them).",
    )  # fmt: skip
    metadata = serializers.DictField(required=False, allow_null=True, help_text="Free-form object, ≤ 4 KiB as JSON.")
    fallback = FallbackStepSerializer(
        many=True, required=False, allow_null=True,
        help_text="At most one step; needs `subscriber`. If this notification ends failed/dead_lettered, gets a "
        "bounced/undelivered/failed receipt, or no delivered receipt within after_seconds of the provider's "
        "acceptance, a linked notification goes out on the step's channel to the subscriber's address there.",
    )  # fmt: skip

    def to_internal_value(self, data: Any) -> validation.Draft:
        try:
            return validation.clean_notification(data)
        except FieldErrors as exc:
            raise serializers.ValidationError(exc.errors) from None


class NotificationBatchSerializer(StrictSerializer):
    notifications = serializers.ListField(
        child=NotificationCreateSerializer(), min_length=1, max_length=1000, help_text="1 to 1,000 notifications."
    )


class NotificationFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Status.choices, required=False)
    channel = serializers.ChoiceField(choices=Channel.choices, required=False)
    receipt = serializers.ChoiceField(choices=ReceiptStatus.choices, required=False,
                                      help_text="What the provider reported after accepting it.")  # fmt: skip
    created_after = serializers.DateTimeField(required=False, help_text="ISO 8601 with a UTC offset.")
    created_before = serializers.DateTimeField(required=False, help_text="ISO 8601 with a UTC offset.")

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        errors: dict[str, list[str]] = {}
        clean: dict[str, Any] = {}
        choosing = (("status", Status.values), ("channel", Channel.values), ("receipt", ReceiptStatus.values))
        for name, choices in choosing:
            if name in data:
                if data[name] in choices:
                    clean[name] = data[name]
                else:
                    errors[name] = [f"must be one of {', '.join(choices)}"]
        for name in ("created_after", "created_before"):
            if name in data:
                try:
                    clean[name] = parse_aware_datetime(data[name])
                except ValueError as exc:
                    errors[name] = [str(exc)]
        if errors:
            raise serializers.ValidationError(errors)
        return clean


# --- responses ------------------------------------------------------------------------------------


class AttemptSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField()
    outcome = serializers.ChoiceField(choices=AttemptOutcome.choices)
    error_class = serializers.CharField()
    error_code = serializers.CharField()
    http_status = serializers.IntegerField(allow_null=True)
    duration_ms = serializers.IntegerField()
    provider = serializers.CharField(allow_null=True, help_text="The provider this try went through (its name).")

    def to_representation(self, a: Any) -> dict[str, Any]:
        return attempt_data(a)


def attempt_data(a: Any) -> dict[str, Any]:
    """An attempt's body (AttemptSerializer's), without a serializer instance (the hot path's)."""
    return {
        "number": a.number, "provider": _attempt_provider(a),
        "started_at": iso(a.started_at), "finished_at": iso(a.finished_at),
        "outcome": a.outcome, "error_class": a.error_class, "error_code": a.error_code,
        "http_status": a.http_status, "duration_ms": a.duration_ms,
    }  # fmt: skip


def _attempt_provider(a: Any) -> str | None:  # noqa: ANN401
    if "provider_name" in a.__dict__:  # read with the detail (notifications.reads)
        return a.provider_name
    return a.provider.name if a.provider_id else None


# The API names the component `Event`, as it has always been called there.
@extend_schema_serializer(component_name="Event")
class ReceiptEventSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="The provider's event, normalised: delivered, bounced, sent, deferred, …")
    occurred_at = serializers.DateTimeField()
    provider = serializers.CharField(help_text="Name of the provider that reported it.")
    details = serializers.DictField(help_text="What the provider said (masked): error codes, bounce_type, …")


@extend_schema_field({"type": "string", "enum": ReceiptStatus.values, "nullable": True},
                     component_name="ReceiptStatus")  # fmt: skip
class ReceiptField(serializers.ChoiceField):
    """null until a provider reports; then the highest-ranked receipt (receipts.precedence)."""


def _scheduled_job_id(n: Notification) -> str | None:
    """The id of its scheduled job, where the read that loaded it looked it up (`scheduled_job_id`:
    reads.detail, the list's annotation, the create); else None."""
    job_id = n.__dict__.get("scheduled_job_id")
    return None if job_id is None else str(job_id)


class NotificationSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    channel = serializers.ChoiceField(choices=Channel.choices)
    recipient_masked = serializers.CharField(help_text="The recipient, masked: j***@example.com, +1******4567.")
    provider = serializers.CharField(help_text="Provider name.")
    template = serializers.CharField(allow_null=True, help_text="Template key, if rendered from one.")
    template_version = serializers.IntegerField(allow_null=True, help_text="The template version rendered.")
    locale = serializers.CharField(
        allow_null=True, help_text="The template variant rendered (a BCP 47 tag); null: the template's own fields."
    )
    subject = serializers.CharField()
    body = serializers.CharField()
    html_body = serializers.CharField(allow_blank=True, help_text="Email: the HTML part (empty: text only).")
    context = serializers.DictField()
    priority = serializers.IntegerField(min_value=0, max_value=9)
    queue = serializers.CharField()
    category = serializers.CharField()
    subscriber = serializers.CharField(allow_null=True, help_text="The subscriber's external_id, if named.")
    status = serializers.ChoiceField(choices=Status.choices)
    scheduled_for = serializers.DateTimeField(allow_null=True)
    scheduled_job_id = serializers.UUIDField(allow_null=True, help_text="Pending/executed job for scheduled sends.")
    metadata = serializers.DictField()
    attempt_count = serializers.IntegerField()
    last_error_code = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    enqueued_at = serializers.DateTimeField(allow_null=True)
    delivered_at = serializers.DateTimeField(allow_null=True)
    receipt = ReceiptField(
        choices=ReceiptStatus.choices, allow_null=True,
        help_text="What the provider reported after accepting it (null until it does). A later `delivered` "
        "never hides an earlier `bounced`: delivered < undelivered < failed < bounced < complained.",
    )  # fmt: skip
    bounce_type = serializers.ChoiceField(choices=BounceType.choices, allow_null=True,
                                          help_text="hard or soft when receipt is bounced.")  # fmt: skip
    fallback = FallbackStepSerializer(many=True, allow_null=True, help_text="The fallback chain asked for, or null.")
    fallback_notification_id = serializers.UUIDField(
        allow_null=True, help_text="The linked notification on the fallback channel (scheduled until its time, "
        "cancelled if a delivered receipt came first).",
    )  # fmt: skip
    fallback_of = serializers.UUIDField(allow_null=True, help_text="The notification this one is the fallback of.")
    bulk_send_id = serializers.UUIDField(allow_null=True, help_text="The bulk send it was created by, if any.")
    row = serializers.IntegerField(allow_null=True, help_text="Its 1-based data row in the bulk send's file.")
    test = serializers.BooleanField(help_text="Created with a test key: sent to the simulator, seen by test keys only.")

    def to_representation(self, n: Notification) -> dict[str, Any]:
        return notification_data(n)


def notification_data(n: Notification) -> dict[str, Any]:
    """A notification's body (NotificationSerializer's, the fields declared there), built without
    a serializer instance: the hot path's answer (notifications.api.hot) and the views' are one."""
    template = n.template if n.template_id is not None else None
    return {
        "id": str(n.id), "channel": n.channel, "recipient_masked": n.recipient_masked,
        "provider": n.provider.name, "template": template.key if template else None,
        "template_version": n.template_version, "locale": n.locale,
        "subject": n.subject, "body": n.body, "html_body": n.html_body, "context": n.context,
        "priority": n.priority, "queue": n.queue,
        "category": n.category, "subscriber": n.subscriber, "status": n.live_status,
        "scheduled_for": iso(n.scheduled_for), "scheduled_job_id": _scheduled_job_id(n),
        "metadata": n.metadata, "attempt_count": n.attempt_count, "last_error_code": n.last_error_code,
        "created_at": iso(n.created_at), "updated_at": iso(n.updated_at), "enqueued_at": iso(n.enqueued_at),
        "delivered_at": iso(n.delivered_at), "receipt": n.receipt, "bounce_type": n.bounce_type,
        "fallback": n.fallback, "fallback_notification_id": _text(n.fallback_notification_id),
        "fallback_of": _text(n.fallback_of), "bulk_send_id": _text(n.bulk_send_id), "row": n.bulk_row, "test": n.test,
    }  # fmt: skip


def _text(value: Any) -> str | None:  # noqa: ANN401
    return None if value is None else str(value)


class DeviceResultSerializer(serializers.Serializer):
    device_id = serializers.UUIDField()
    kind = serializers.ChoiceField(choices=["fcm", "apns", "webpush"])
    status = serializers.ChoiceField(choices=["pending", "delivered", "failed", "deactivated"])
    error_code = serializers.CharField(allow_null=True)


class NotificationDetailSerializer(NotificationSerializer):
    attempts = AttemptSerializer(many=True)
    events = ReceiptEventSerializer(many=True, help_text="Receipt events from the provider, oldest first.")
    devices = DeviceResultSerializer(
        many=True, required=False,
        help_text="push only: the subscriber's devices it goes to and how each went (empty for a push to a recipient).",
    )  # fmt: skip

    def to_representation(self, n: Notification) -> dict[str, Any]:
        return notification_detail_data(n)


def notification_detail_data(n: Notification) -> dict[str, Any]:
    """NotificationDetailSerializer's body, without serializer instances."""
    data = notification_data(n)
    data["attempts"] = [attempt_data(a) for a in n.attempts.all()]
    data["events"] = [{**e, "occurred_at": iso(e["occurred_at"])} for e in reads.receipt_events(n)]
    if n.channel == "push":  # a push to a subscriber's devices: how each went (none otherwise)
        data["devices"] = reads.device_results(n)
    return data


class NotificationBatchResultSerializer(serializers.Serializer):
    results = NotificationSerializer(many=True, help_text="The created notifications, in request order.")


@extend_schema_field({"type": "string", "enum": ScheduledJob.Status.values}, component_name="ScheduledJobStatus")
class ScheduledJobStatusField(serializers.ChoiceField):
    """Its own enum component: `status` of notifications is another set of values."""


class ScheduledJobSerializer(serializers.ModelSerializer):
    notification_id = serializers.UUIDField(read_only=True)
    status = ScheduledJobStatusField(choices=ScheduledJob.Status.choices, read_only=True)

    class Meta:
        model = ScheduledJob
        fields = ["job_id", "notification_id", "run_at", "status", "created_at", "executed_at"]
        read_only_fields = fields
