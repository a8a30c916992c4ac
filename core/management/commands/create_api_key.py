from __future__ import annotations

import json as jsonlib

from django.core.management.base import BaseCommand

from core import services
from core.management.tenants import resolve_tenant
from core.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key for a tenant (by id or name) and print it once."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("tenant")
        parser.add_argument("--name", default="")
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--test", action="store_true", help="a test key (op_test_…): sends go to the simulator")

    def handle(self, *args, tenant: str, name: str, json: bool, test: bool = False, **options) -> None:
        owner = resolve_tenant(tenant)
        key = ApiKey(tenant=owner, name=name, test=test)
        raw = services.issue_api_key(key, actor="system:create_api_key")
        if json:
            self.stdout.write(jsonlib.dumps({"tenant_id": str(owner.pk), "api_key": raw, "prefix": key.prefix}))
        else:
            self.stdout.write(f"api_key: {raw}\n(the key is shown once; store it now)")
