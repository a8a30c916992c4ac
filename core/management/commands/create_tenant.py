from __future__ import annotations

import json as jsonlib

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from core.models import ApiKey, AuditEvent, Tenant


class Command(BaseCommand):
    help = "Create a tenant and print its id and a first API key (shown once)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("name")
        parser.add_argument("--json", action="store_true", help='print {"tenant_id": …, "api_key": …}')

    def handle(self, *args, name: str, json: bool, **options) -> None:
        name = name.strip()
        if not name:
            raise CommandError("the tenant name must not be empty")
        if Tenant.objects.filter(name=name).exists():
            raise CommandError(f"a tenant named {name!r} already exists")
        with transaction.atomic():
            tenant = Tenant.objects.create(name=name)
            _, raw = ApiKey.issue(tenant, name="first key")
            AuditEvent.record(actor="system:create_tenant", action="tenant.created", target=tenant, tenant=tenant)
        if json:
            self.stdout.write(jsonlib.dumps({"tenant_id": str(tenant.pk), "api_key": raw}))
        else:
            self.stdout.write(f"tenant_id: {tenant.pk}\napi_key:   {raw}\n(the key is shown once; store it now)")
