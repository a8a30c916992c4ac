"""Tenants, staff membership, and the tenant-scoped QuerySet every tenant-owned model uses."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, unique=True)
    is_active = models.BooleanField(default=True)
    # Optional shared token bucket over all of the tenant's deliveries (None: unlimited).
    rate_per_second = models.FloatField(null=True, blank=True)
    rate_burst = models.PositiveIntegerField(null=True, blank=True)
    # Share of the dispatchers when tenants compete: a claim gives each tenant with
    # ready work weight/Σweights of the batch, interleaved (queueing.queue.claim_ctes).
    weight = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Share of the dispatchers against other tenants with work waiting (1–1000).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Bumped in the transaction of every change to the tenant's providers or templates: web
    # processes cache those and their creates only store while the version they read is current
    # (notifications.tenant_config), so an edit takes effect for the next create in every process.
    config_version = models.PositiveBigIntegerField(default=0, editable=False)

    # The mode of the request acting for the tenant (not a column): True with a test key, False with a
    # live key, None outside the API (admin, processes: both modes). The managers of mode-owned
    # tables (ModeOwnedQuerySet) scope by it, so an API view never sees the other mode's rows.
    test_mode: bool | None = None

    class Meta:
        db_table = "tenants"
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(weight__gte=1, weight__lte=1000), name="tenant_weight_1_1000"),
        ]

    def __str__(self) -> str:
        return self.name


class TenantMembership(models.Model):
    """A staff user who may see one tenant in the admin (superusers see every tenant)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "tenant_memberships"
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="tenant_membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant}"


class TenantQuerySet(models.QuerySet):
    """Base for every tenant-owned model: API paths start with `for_tenant(tenant)`."""

    def for_tenant(self, tenant: Tenant | uuid.UUID | str) -> TenantQuerySet:
        tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
        if tenant_id is None:
            # filter(tenant_id=None) would mean `IS NULL` and match unowned rows (system audit events).
            raise ValueError("for_tenant() needs a tenant, got None")
        return self.filter(tenant_id=tenant_id)

    def visible_to(self, user: Any) -> TenantQuerySet:
        """What a staff user may see in the admin: all for superusers, else their tenants only."""
        if user.is_superuser:
            return self
        return self.filter(tenant__memberships__user=user)


def mode_of(tenant: Any) -> bool:
    """Whether what `tenant` (a Tenant acting through a key) creates is test data."""
    return bool(getattr(tenant, "test_mode", False))


def in_mode(tenant: Any, test: bool) -> bool:
    """Whether a row of this mode (`test`) is visible to `tenant` (as ModeOwnedQuerySet scopes), for
    the reads that are raw statements."""
    mode = getattr(tenant, "test_mode", None)
    return mode is None or mode == test


class ModeOwnedQuerySet(TenantQuerySet):
    """Base for tables whose rows belong to one mode (`test`): notifications, workflow runs,
    suppressions, dead letters, bulk sends. `for_tenant` keeps the rows of the mode of the key the
    tenant acts through (a Tenant from the API carries it), and all of them for a bare tenant id."""

    def for_tenant(self, tenant: Tenant | uuid.UUID | str) -> ModeOwnedQuerySet:
        rows = super().for_tenant(tenant)
        mode = getattr(tenant, "test_mode", None)
        return rows if mode is None else rows.filter(test=mode)


# Hot tables carry no database-level foreign keys to hot parent rows. A foreign-key check locks
# the parent row (FOR KEY SHARE) on every insert, so thousands of inserts a second that all point
# at one tenant or provider row pile up multixact locks on it. Deletes still cascade and protect
# through Django's collector; nothing deletes these rows with raw SQL.
HOT_FK = {"db_constraint": False}


class TenantOwned(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", **HOT_FK)

    objects = TenantQuerySet.as_manager()

    class Meta:
        abstract = True
