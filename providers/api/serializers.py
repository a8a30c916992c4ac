"""The provider a tenant configures.

Provider secrets are write-only: they are read back masked (`{"signing_secret": "****abcd"}`).
`name`, `channel` and `kind` are fixed once created (create a new object to change them).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.schema import (
    StrictBooleanField,
    StrictFloatField,
    StrictIntegerField,
    StrictRegexField,
    StrictSerializer,
    refuse_changes,
)
from core.channels import Channel
from core.masking import mask_secret
from core.validation import NAME
from providers.circuit import CLOSED, STATES, settings_of, validate_circuit
from providers.models import Provider, ProviderKind
from queueing.models import RateBucket

# Which channels each kind of provider can deliver.
KIND_CHANNELS = {
    ProviderKind.WEBHOOK: (Channel.PUSH, Channel.WEBHOOK),
    ProviderKind.SMTP: (Channel.EMAIL,),
    ProviderKind.TWILIO: (Channel.SMS,),
    ProviderKind.SENDGRID: (Channel.EMAIL,),
    ProviderKind.CONSOLE: tuple(c for c in Channel if c != Channel.IN_APP),
    ProviderKind.SES: (Channel.EMAIL,),
    ProviderKind.FCM: (Channel.PUSH,),
    ProviderKind.APNS: (Channel.PUSH,),
    ProviderKind.WEBPUSH: (Channel.PUSH,),
    ProviderKind.INBOX: (Channel.IN_APP,),  # built in: every tenant has one (providers.services)
}
IMMUTABLE = ("name", "channel", "kind")


@extend_schema_field(
    {"type": "object", "additionalProperties": {"type": "string"},
     "description": "Write-only values; read back masked, e.g. {\"signing_secret\": \"****abcd\"}."}  # fmt: skip
)
class SecretsField(serializers.Field):
    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise serializers.ValidationError("must be a JSON object of strings")
        return data

    def to_representation(self, value: Any) -> dict[str, str]:
        return {str(k): mask_secret(v) for k, v in (value or {}).items()}


class RateLimitSerializer(StrictSerializer):
    rate_per_second = StrictFloatField(min_value=0.001, max_value=1_000_000)
    burst = StrictIntegerField(min_value=1, max_value=1_000_000, required=False, allow_null=True)


class ProviderSerializer(StrictSerializer):
    id = serializers.IntegerField(read_only=True, help_text="Names the provider in its events_url.")
    name = StrictRegexField(NAME.pattern, max_length=100)
    channel = serializers.ChoiceField(choices=Channel.choices)
    kind = serializers.ChoiceField(choices=ProviderKind.choices)
    config = serializers.DictField(required=False, help_text="Settings for the kind.")
    secrets = SecretsField(required=False)
    rate_limit = RateLimitSerializer(required=False, allow_null=True, help_text="null: unlimited.")
    max_attempts = StrictIntegerField(
        min_value=1, max_value=100, required=False, allow_null=True, help_text="null: OMNIPOST_MAX_ATTEMPTS."
    )
    is_default = StrictBooleanField(required=False, help_text="Setting it unsets the channel's old default.")
    failover_order = StrictIntegerField(
        min_value=0, max_value=32767, required=False, allow_null=True,
        help_text="Place in the channel's failover order (lowest first): a notification that names no provider "
        "starts at the lowest and moves to the next on a transient failure or an open breaker. null: not in it.",
    )  # fmt: skip
    circuit = serializers.DictField(
        required=False,
        help_text="Circuit breaker settings: failure_threshold (0–1, default 0.5), min_requests (20), "
        "window_seconds (60), open_seconds (30).",
    )
    circuit_state = serializers.ChoiceField(
        choices=list(STATES), read_only=True, help_text="The breaker, as every dispatcher sees it."
    )
    effective_rate_per_second = serializers.FloatField(
        read_only=True, allow_null=True, help_text="The adaptive rate the dispatchers currently use."
    )
    events_url = serializers.URLField(
        read_only=True, allow_null=True,
        help_text="Where the vendor posts delivery receipts (status callbacks, event webhooks), authenticated by "
        "its signature: OMNIPOST_PUBLIC_URL + /hooks/providers/{id}; null while OMNIPOST_PUBLIC_URL is not set.",
    )  # fmt: skip
    created_at = serializers.DateTimeField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        from providers.kinds import REGISTRY  # the kinds are loaded only when needed

        instance: Provider | None = self.instance
        refuse_changes(instance, attrs, IMMUTABLE)
        kind = attrs.get("kind", instance.kind if instance else None)
        channel = attrs.get("channel", instance.channel if instance else None)
        if channel not in KIND_CHANNELS[kind]:
            allowed = ", ".join(KIND_CHANNELS[kind])
            raise serializers.ValidationError({"channel": [f"a {kind} provider serves channel(s): {allowed}"]})
        if instance is None or "config" in attrs or "secrets" in attrs:
            config = attrs.get("config", instance.config if instance else {})
            secrets = attrs.get("secrets", instance.secrets if instance else {})
            attrs["config"] = REGISTRY[kind].validate(config, secrets, check_destination=True)
            attrs["secrets"] = secrets
        if "circuit" in attrs:
            try:
                attrs["circuit"] = validate_circuit(attrs["circuit"])
            except ValueError as exc:
                raise serializers.ValidationError({"circuit": [str(exc)]}) from None
        if "rate_limit" in attrs:
            limit = attrs.pop("rate_limit") or {}
            attrs["rate_per_second"] = limit.get("rate_per_second")
            attrs["burst"] = limit.get("burst")
        return attrs

    def to_representation(self, p: Provider) -> dict[str, Any]:
        if hasattr(p, "bucket_rate"):
            effective = p.bucket_rate
        else:
            buckets = RateBucket.objects.filter(key=f"provider:{p.pk}")
            effective = buckets.values_list("effective_rate", flat=True).first()
        limit = None if p.rate_per_second is None else {"rate_per_second": p.rate_per_second, "burst": p.burst}
        return {
            "id": p.pk, "name": p.name, "channel": p.channel, "kind": p.kind, "config": p.config,
            "secrets": SecretsField().to_representation(p.secrets), "rate_limit": limit,
            "max_attempts": p.max_attempts, "is_default": p.is_default, "failover_order": p.failover_order,
            "circuit": settings_of(p.circuit),
            "circuit_state": getattr(p, "circuit_state", None) or CLOSED,  # none yet: just created
            "effective_rate_per_second": effective if effective is not None else p.rate_per_second,
            "events_url": p.receipts_url,  # the API's name for where receipts go
            "created_at": self.fields["created_at"].to_representation(p.created_at),
            "updated_at": self.fields["updated_at"].to_representation(p.updated_at),
        }  # fmt: skip
