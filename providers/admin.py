"""Providers in the console: operators tune rate limits, attempts, the failover order and the breaker
settings; everything else changes through the API, which validates the kind's configuration. Staff see
only their tenants' (TenantScopedAdmin); secrets are shown masked only."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from core.admin_scoping import TenantScopedAdmin
from core.masking import mask_secret
from providers import services
from providers.circuit import CLOSED, validate_circuit
from providers.models import Provider


class ProviderForm(forms.ModelForm):
    class Meta:
        model = Provider
        fields = ["rate_per_second", "burst", "max_attempts", "failover_order", "circuit"]

    def clean_circuit(self) -> dict:
        try:
            return validate_circuit(self.cleaned_data.get("circuit") or {})
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(Provider)
class ProviderAdmin(TenantScopedAdmin):
    """Operators tune rate limits and attempts here; everything else changes through the API, which
    validates the configuration. Secrets are shown masked only."""

    form = ProviderForm
    list_display = [
        "name", "tenant", "channel", "kind", "is_default", "failover_order", "circuit_state", "rate_per_second",
        "effective_rate", "max_attempts",
    ]  # fmt: skip
    list_filter = ["kind", "channel", "is_default"]
    search_fields = ["name"]
    readonly_fields = ["tenant", "name", "channel", "kind", "config", "masked_secrets", "is_default", "created_at",
                       "updated_at"]  # fmt: skip
    fields = [*readonly_fields[:6], "rate_per_second", "burst", "max_attempts", "failover_order", "circuit",
              "circuit_state", *readonly_fields[6:]]  # fmt: skip
    readonly_fields = [*readonly_fields, "circuit_state"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).as_shown()

    @admin.display(description="breaker")
    def circuit_state(self, obj: Provider) -> str:
        """closed | open | half_open, as every dispatcher sees it (routing's, shown through `as_shown`)."""
        return getattr(obj, "circuit_state", None) or CLOSED

    @admin.display(description="effective rate /s")
    def effective_rate(self, obj: Provider) -> str:
        """The adaptive rate the dispatchers use now (lowered after 429s), when it is limited."""
        rate = getattr(obj, "bucket_rate", None)
        return "—" if rate is None else f"{rate:g}"

    @admin.display(description="secrets")
    def masked_secrets(self, obj: Provider) -> str:
        return ", ".join(f"{k}: {mask_secret(v)}" for k, v in sorted((obj.secrets or {}).items())) or "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        services.save_provider(obj, actor=f"user:{request.user.get_username()}", fields=list(form.changed_data))
