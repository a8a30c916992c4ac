from __future__ import annotations

import json as jsonlib

from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction

from core.models import ApiKey, AuditEvent, Tenant


class Command(BaseCommand):
    help = "Create a tenant and print its id and a first API key (shown once)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("name")
        parser.add_argument(
            "--json", action="store_true", help='print {"tenant_id": …, "api_key": …, "test_api_key": …}'
        )

    def handle(self, *args, name: str, json: bool, **options) -> None:
        name = name.strip()
        if not name:
            raise CommandError("the tenant name must not be empty")
        limit = Tenant._meta.get_field("name").max_length
        if len(name) > limit:
            raise CommandError(f"the tenant name must be at most {limit} characters (got {len(name)})")
        if Tenant.objects.filter(name=name).exists():
            raise CommandError(f"a tenant named {name!r} already exists")
        try:
            with transaction.atomic():
                tenant = Tenant.objects.create(name=name)
                _, raw = ApiKey.issue(tenant, name="first key")
                _, test_raw = ApiKey.issue(tenant, name="first test key", test=True)
                AuditEvent.record(actor="system:create_tenant", action="tenant.created", target=tenant, tenant=tenant)
        except IntegrityError:  # created concurrently between the check and the insert
            raise CommandError(f"a tenant named {name!r} already exists") from None
        if json:
            self.stdout.write(jsonlib.dumps({"tenant_id": str(tenant.pk), "api_key": raw, "test_api_key": test_raw}))
        else:
            self.stdout.write(
                f"tenant_id: {tenant.pk}\napi_key:   {raw}\ntest_api_key: {test_raw}\n"
                "(the keys are shown once; store them now)"
            )
