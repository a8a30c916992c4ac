"""A tenant's templates: a subject and a body for one channel, rendered by the sandboxed engine
(templating.renderer) when a notification names the template's key."""

from __future__ import annotations

from django.db import models

from core.channels import Channel
from core.models import TenantOwned


class Template(TenantOwned):
    key = models.SlugField(max_length=100)
    channel = models.CharField(max_length=10, choices=Channel.choices)
    subject = models.TextField(blank=True, default="")
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "templates"
        ordering = ["key"]
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="template_key_unique_per_tenant")]

    def __str__(self) -> str:
        return self.key
