"""Who a tenant's notifications go to: categories of notification and subscribers.

A subscriber is the tenant's user, named by the tenant's own `external_id`; its addresses are stored
encrypted (and masked beside them, for lists that must not decrypt), its `preferences` say which
categories it wants on which channel. Categories are the tenant's kinds of message; a critical one
ignores opt-outs. Both are models of the notifications app, in a module of their own."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from core.fields import EncryptedJSONField, EncryptedTextField
from core.ids import uuid7
from core.models import Tenant, TenantOwned
from core.models.tenancy import HOT_FK

GENERAL = "general"


class Category(TenantOwned):
    key = models.SlugField(max_length=100)
    critical = models.BooleanField(default=False)
    description = models.TextField(blank=True, default="")
    # {"start": "HH:MM", "end": "HH:MM"} or null (inherits general's); used by quiet hours.
    quiet_hours = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "categories"
        ordering = ["key"]
        verbose_name_plural = "categories"
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="category_key_unique_per_tenant")]

    def __str__(self) -> str:
        return f"{self.key}{' (critical)' if self.critical else ''}"


class Subscriber(TenantOwned):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, **HOT_FK)
    external_id = models.CharField(max_length=200)
    email = EncryptedTextField(null=True, blank=True)
    email_masked = models.CharField(max_length=200, blank=True, default="")
    phone = EncryptedTextField(null=True, blank=True)
    phone_masked = models.CharField(max_length=40, blank=True, default="")
    push_tokens = EncryptedJSONField(default=list, blank=True)
    push_tokens_masked = models.JSONField(default=list, blank=True)
    timezone = models.CharField(max_length=64, blank=True, default="")
    preferences = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "subscribers"
        constraints = [
            # GET/PUT subscribers/{external_id}, notifications by subscriber, the bulk upsert's ON CONFLICT.
            models.UniqueConstraint(fields=["tenant", "external_id"], name="subscriber_external_id_unique"),
        ]
        indexes = [
            # GET subscribers: a tenant's newest first, cursor-paginated on (created_at, id).
            models.Index(fields=["tenant", "-created_at", "-id"], name="subscriber_tenant_recent_idx"),
        ]

    def __str__(self) -> str:
        return self.external_id

    def address_for(self, channel: str) -> str | None:
        """The address a notification on `channel` goes to (push: the first token); None if none."""
        if channel == "email":
            return self.email or None
        if channel == "sms":
            return self.phone or None
        if channel == "push":
            tokens = self.push_tokens or []
            return tokens[0] if tokens else None
        return None  # webhook: no subscriber address

    def opted_out(self, category: str, channel: str) -> bool:
        return (self.preferences or {}).get(category, {}).get(channel) is False
