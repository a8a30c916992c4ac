from __future__ import annotations

import json as jsonlib

from django.core.management.base import BaseCommand
from django.db import transaction

from core.management.tenants import resolve_tenant
from core.models import ApiKey, AuditEvent


class Command(BaseCommand):
    help = "Create an API key for a tenant (by id or name) and print it once."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("tenant")
        parser.add_argument("--name", default="")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, tenant: str, name: str, json: bool, **options) -> None:
        owner = resolve_tenant(tenant)
        with transaction.atomic():
            key, raw = ApiKey.issue(owner, name=name)
            AuditEvent.record(actor="system:create_api_key", action="api_key.created", target=key)
        if json:
            self.stdout.write(jsonlib.dumps({"tenant_id": str(owner.pk), "api_key": raw, "prefix": key.prefix}))
        else:
            self.stdout.write(f"api_key: {raw}\n(the key is shown once; store it now)")
