"""Append-only audit log. Updates and deletes are refused by the model, the QuerySet, the admin
and a trigger, so not even raw SQL can rewrite history."""

from __future__ import annotations

from typing import Any

from django.db import models

from core.masking import mask_mapping
from core.models.tenancy import Tenant, TenantQuerySet


class AuditLogIsAppendOnly(Exception):
    pass


class AuditEventQuerySet(TenantQuerySet):
    def update(self, **kwargs: Any) -> int:
        raise AuditLogIsAppendOnly("audit events cannot be updated")

    def bulk_update(self, objs: Any, fields: Any, batch_size: int | None = None) -> int:
        raise AuditLogIsAppendOnly("audit events cannot be updated")

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list:
        # An upsert (ON CONFLICT DO UPDATE) would rewrite existing events.
        if kwargs.get("update_conflicts"):
            raise AuditLogIsAppendOnly("audit events cannot be updated")
        return super().bulk_create(objs, *args, **kwargs)

    def update_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise AuditLogIsAppendOnly("audit events cannot be updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AuditLogIsAppendOnly("audit events cannot be deleted")

    _raw_delete = delete


class AuditEvent(models.Model):
    tenant = models.ForeignKey(
        Tenant, on_delete=models.DO_NOTHING, null=True, blank=True, related_name="+", db_constraint=False
    )
    actor = models.CharField(max_length=200, help_text="user:<name>, api_key:<prefix> or system:<process>")
    action = models.CharField(max_length=100)
    target_type = models.CharField(max_length=100)
    target_id = models.CharField(max_length=100)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        db_table = "audit_events"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="audit_tenant_recent_idx")]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.target_type}:{self.target_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AuditLogIsAppendOnly("audit events cannot be updated")
        if kwargs.get("update_fields") is not None or kwargs.get("force_update"):
            raise AuditLogIsAppendOnly("audit events cannot be updated")
        self.details = mask_mapping(self.details)
        # Always an INSERT: a new instance carrying an existing pk must not become an UPDATE.
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise AuditLogIsAppendOnly("audit events cannot be deleted")

    @classmethod
    def record(
        cls,
        *,
        actor: str,
        action: str,
        target: models.Model | None = None,
        target_type: str = "",
        target_id: Any = "",
        tenant: Any = None,
        details: dict | None = None,
    ) -> AuditEvent:
        if target is not None:
            target_type = target_type or target._meta.label_lower
            target_id = target_id or target.pk
            tenant = tenant if tenant is not None else getattr(target, "tenant_id", None)
        tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
        return cls.objects.create(
            actor=actor,
            action=action,
            target_type=target_type,
            target_id=str(target_id),
            tenant_id=tenant_id,
            details=details or {},
        )

    @classmethod
    def bulk_record(cls, events: list[AuditEvent]) -> None:
        for e in events:
            e.details = mask_mapping(e.details)
        cls.objects.bulk_create(events)
