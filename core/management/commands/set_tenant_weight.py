from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core import services
from core.management.tenants import resolve_tenant


class Command(BaseCommand):
    help = "Set a tenant's fairness weight (1–1000, default 1): its share of the dispatchers when tenants compete."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("tenant", help="the tenant's id or name")
        parser.add_argument("weight", type=int)

    def handle(self, *args, tenant: str, weight: int, **options) -> None:
        found = resolve_tenant(tenant)
        try:
            services.set_tenant_weight(found, weight, actor="system:set_tenant_weight")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"tenant {found.name} weight {weight}")
