"""Event endpoint serializers: the endpoint (secret write-only), recover's body and attempts.

The secret is generated when absent and shown once, in the 201 (the view adds it); a secret the
client supplies is never echoed. `url` is held to the SSRF rules of webhook providers.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.schema import StrictBooleanField, StrictCharField, StrictRegexField, StrictSerializer, iso
from core.validation import NAME, parse_aware_datetime
from events.models import ALL_TYPES, EventAttempt, EventEndpoint, EventType, public_event_id
from providers import ssrf
from providers.kinds.webhook import decode_signing_secret

TYPE_CHOICES = [*EventType.values, ALL_TYPES]


def check_url(url: str) -> str:
    """An http(s) URL whose host resolves to public addresses (unless
    OMNIPOST_ALLOW_PRIVATE_DESTINATIONS); the lane checks the resolved address again at connect time."""
    from core.http import split_url

    try:
        origin, _ = split_url(url)
    except ValueError as exc:
        raise serializers.ValidationError(str(exc)) from None
    if ssrf.private_allowed():
        return url
    try:
        ssrf.resolve_checked(origin.host, origin.port, allow_private=False)
    except ssrf.DestinationForbidden as exc:
        raise serializers.ValidationError(str(exc)) from None
    except (OSError, UnicodeError):
        raise serializers.ValidationError(f"the host {origin.host} does not resolve") from None
    return url


class EventEndpointSerializer(StrictSerializer):
    name = StrictRegexField(NAME.pattern, max_length=100, help_text="Fixed once created.")
    url = StrictCharField(
        max_length=2000, trim_whitespace=False,  # refused with the reason (core.http.split_url), never trimmed
        help_text="http(s) URL events are POSTed to; public addresses only; no whitespace or control characters.",
    )  # fmt: skip
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=TYPE_CHOICES), allow_empty=False, max_length=len(TYPE_CHOICES),
        help_text='Event types to receive, or ["*"] for every type.',
    )  # fmt: skip
    enabled = StrictBooleanField(required=False, help_text="true re-enables a disabled endpoint without re-sending.")
    secret = StrictCharField(
        write_only=True, required=False, max_length=200,
        help_text="whsec_ + base64 of 16–64 bytes; generated when absent and shown once in the 201. "
        "A new one rotates: the old one signs beside it for OMNIPOST_SECRET_ROTATION_GRACE_SECONDS.",
    )  # fmt: skip
    disabled_reason = serializers.CharField(read_only=True, help_text="Why it was disabled; empty while enabled.")
    failing_since = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Start of the current unbroken run of failed attempts."
    )
    created_at = serializers.DateTimeField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True)

    def validate_name(self, value: str) -> str:
        if self.instance is not None and value != self.instance.name:
            raise serializers.ValidationError("cannot be changed after creation; create a new endpoint instead")
        return value

    def validate_url(self, value: str) -> str:
        return check_url(value)

    def validate_event_types(self, value: list[str]) -> list[str]:
        if ALL_TYPES in value and len(value) > 1:
            raise serializers.ValidationError('"*" means every type and stands alone: ["*"]')
        return list(dict.fromkeys(value))

    def validate_secret(self, value: str) -> str:
        try:
            decode_signing_secret(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def to_representation(self, e: EventEndpoint) -> dict[str, Any]:
        return {
            "name": e.name, "url": e.url, "event_types": e.event_types, "enabled": e.enabled,
            "disabled_reason": e.disabled_reason, "failing_since": iso(e.failing_since),
            "created_at": iso(e.created_at), "updated_at": iso(e.updated_at),
        }  # fmt: skip


class CreatedEventEndpointSerializer(EventEndpointSerializer):
    """The 201: the endpoint, plus the generated secret (once; absent when the client gave one)."""

    secret = serializers.CharField(read_only=True, required=False, help_text="Only when generated; shown once.")


class RecoverSerializer(StrictSerializer):
    since = StrictCharField(help_text="ISO 8601 with a UTC offset: re-send what was not delivered since then.")

    def validate_since(self, value: str) -> Any:
        try:
            return parse_aware_datetime(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class RecoverResultSerializer(serializers.Serializer):
    queued = serializers.IntegerField(help_text="Events queued again for this endpoint.")


class EventAttemptSerializer(serializers.Serializer):
    event_id = serializers.CharField(help_text="The event's id: its webhook-id header.")
    type = serializers.ChoiceField(choices=EventType.choices)
    status = serializers.ChoiceField(choices=["delivered", "failed"])
    http_status = serializers.IntegerField(allow_null=True)
    duration_ms = serializers.IntegerField()
    attempted_at = serializers.DateTimeField()

    def to_representation(self, a: EventAttempt) -> dict[str, Any]:
        return {
            "event_id": public_event_id(a.event_id), "type": a.event_type, "status": a.status,
            "http_status": a.http_status, "duration_ms": a.duration_ms, "attempted_at": iso(a.attempted_at),
        }  # fmt: skip
