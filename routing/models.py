"""The state routing keeps: each provider's circuit breaker, one row shared by every dispatcher
(its statements: routing.circuits; its rule: routing.breaker)."""

from __future__ import annotations

from django.db import models

from providers.circuit import CLOSED


class ProviderCircuit(models.Model):
    """A provider's breaker (routing.circuits explains it); written only by the record statement and
    by `circuits.reserve_probes`."""

    provider = models.OneToOneField("providers.Provider", on_delete=models.CASCADE, primary_key=True,
                                    related_name="circuit_row")  # fmt: skip
    state = models.CharField(max_length=8, default=CLOSED)  # closed | open (half_open is derived)
    opened_at = models.DateTimeField(null=True, blank=True)
    probes = models.PositiveSmallIntegerField(default=0)  # sends let through since it half-opened
    window_started_at = models.DateTimeField()
    base_requests = models.BigIntegerField(default=0)  # the provider's counters at the window's start
    base_failures = models.BigIntegerField(default=0)
    prev_requests = models.BigIntegerField(default=0)  # the previous window's counts
    prev_failures = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "provider_circuits"

    def __str__(self) -> str:
        return f"breaker of provider {self.provider_id}: {self.state}"
