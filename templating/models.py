"""A tenant's templates: a subject and a body for one channel (and, for email, an HTML body), with
per-locale variants, rendered by the sandboxed engine (templating.renderer) when a notification
names the template's key. Every change makes a new immutable TemplateVersion (numbered from 1);
`Template.version` is the current one, and the template's own fields are that version's."""

from __future__ import annotations

from django.db import models

from core.channels import Channel
from core.models import TenantOwned


class Template(TenantOwned):
    key = models.SlugField(max_length=100)
    channel = models.CharField(max_length=10, choices=Channel.choices)
    subject = models.TextField(blank=True, default="")
    body = models.TextField()
    # Email only: rendered with HTML auto-escaping, sent beside the text body (multipart/alternative).
    html_body = models.TextField(blank=True, default="", db_default="")
    # {"<BCP 47 tag>": {"subject", "body", "html_body"}}: what a notification in that locale renders.
    variants = models.JSONField(default=dict, blank=True, db_default=models.Value({}, models.JSONField()))
    version = models.PositiveIntegerField(default=1, db_default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "templates"
        ordering = ["key"]
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="template_key_unique_per_tenant")]

    def __str__(self) -> str:
        return self.key


class TemplateVersion(TenantOwned):
    """What a template was at one version: written once by templating.services, never changed."""

    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="versions", db_index=False)
    version = models.PositiveIntegerField()
    subject = models.TextField(blank=True, default="")
    body = models.TextField()
    html_body = models.TextField(blank=True, default="")
    variants = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "template_versions"
        ordering = ["template", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["template", "version"], name="template_version_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.template_id} v{self.version}"
