"""A tenant's providers: the accounts its notifications go out through, one kind each (webhook, SMTP,
Twilio, SendGrid, SES, console, and the native push kinds FCM, APNs, Web Push; providers.kinds), with
the limits the dispatchers keep to (rate, attempts), their place in the channel's failover order and
their circuit breaker's settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import OuterRef, Q, Subquery, Value
from django.db.models.functions import Cast, Concat

from core.channels import Channel
from core.fields import EncryptedJSONField
from core.models import TenantOwned, TenantQuerySet
from queueing.models import RateBucket


class ProviderKind(models.TextChoices):
    WEBHOOK = "webhook"
    SMTP = "smtp"
    TWILIO = "twilio"
    SENDGRID = "sendgrid", "SendGrid"
    CONSOLE = "console"
    SES = "ses"
    FCM = "fcm", "FCM"
    APNS = "apns", "APNs"
    WEBPUSH = "webpush", "Web Push"
    INBOX = "inbox"  # the in_app channel's built-in kind: every tenant has one (providers.services)


def receipts_url(provider_id: int | None) -> str | None:
    """Where the provider's vendor posts receipts (`POST /hooks/providers/{id}`, receipts.views):
    under OMNIPOST_PUBLIC_URL, or None while that is not set (or the provider not saved)."""
    base = settings.OMNIPOST_PUBLIC_URL
    if not base or provider_id is None:
        return None
    return f"{base}/hooks/providers/{provider_id}"


# What rooms above add to a provider where it is shown (the API, the console), by annotation name:
# routing hands in its breaker's state (routing.apps), so this room names none of routing's tables.
_SHOWN: dict[str, Callable[[], Any]] = {}


def show_with(name: str, expression: Callable[[], Any]) -> None:
    """Annotate `name`, the expression `expression()` makes, on every `as_shown()` queryset."""
    _SHOWN[name] = expression


class ProviderQuerySet(TenantQuerySet):
    def with_effective_rate(self) -> ProviderQuerySet:
        """Annotate `bucket_rate`: the dispatchers' adaptive rate (None until a bucket exists)."""
        key = Concat(Value("provider:"), Cast(OuterRef("pk"), output_field=models.CharField()))
        rate = RateBucket.objects.filter(key=key).values("effective_rate")[:1]
        return self.annotate(bucket_rate=Subquery(rate, output_field=models.FloatField()))

    def as_shown(self) -> ProviderQuerySet:
        """What the API and the console show of each provider: the adaptive rate (`bucket_rate`) and
        what rooms above registered (`show_with`; routing's `circuit_state`), one subquery each."""
        shown = self.with_effective_rate()
        return shown.annotate(**{name: make() for name, make in _SHOWN.items()}) if _SHOWN else shown


class Provider(TenantOwned):
    name = models.SlugField(max_length=100)
    channel = models.CharField(max_length=10, choices=Channel.choices)
    kind = models.CharField(max_length=10, choices=ProviderKind.choices)
    config = models.JSONField(default=dict, blank=True)
    secrets = EncryptedJSONField(default=dict, blank=True)
    rate_per_second = models.FloatField(null=True, blank=True)
    burst = models.PositiveIntegerField(null=True, blank=True)
    max_attempts = models.PositiveSmallIntegerField(null=True, blank=True)
    is_default = models.BooleanField(default=False)
    # Routing: a notification that names no provider starts at the lowest failover_order of
    # its channel (else the default) and moves along that order (routing.failover); null: not in the order.
    failover_order = models.PositiveSmallIntegerField(null=True, blank=True)
    # The circuit breaker's settings (providers.circuit.CIRCUIT_DEFAULTS for what is left out); its
    # state is the provider's row of routing's `provider_circuits`, shared by every dispatcher.
    circuit = models.JSONField(default=dict, blank=True)
    # What the last rotation replaced (only the kind's `rotating_secrets`, e.g. a webhook's
    # signing_secret), and when: sends carry the old signature beside the new one for
    # OMNIPOST_SECRET_ROTATION_GRACE_SECONDS, so a receiver can switch secrets at any moment.
    previous_secrets = EncryptedJSONField(null=True, blank=True)
    secrets_rotated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ProviderQuerySet.as_manager()

    class Meta:
        db_table = "providers"
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="provider_name_unique_per_tenant"),
            models.UniqueConstraint(
                fields=["tenant", "channel"], condition=Q(is_default=True), name="provider_one_default_per_channel"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def receipts_url(self) -> str | None:
        return receipts_url(self.pk)

    def rotation_options(self) -> dict[str, Any]:
        """`build_provider` options for the secrets the last rotation replaced: they sign beside the
        new ones until `previous_until` (epoch seconds), which the provider checks at each send."""
        if not self.previous_secrets or self.secrets_rotated_at is None:
            return {}
        until = self.secrets_rotated_at.timestamp() + settings.OMNIPOST_SECRET_ROTATION_GRACE_SECONDS
        return {"previous_secrets": self.previous_secrets, "previous_until": until}
