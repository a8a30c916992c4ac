from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from core.models import ApiKey, AuditEvent


class Command(BaseCommand):
    help = "Revoke an API key by its 8-character prefix (the part after `op_`)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("prefix")

    def handle(self, *args, prefix: str, **options) -> None:
        prefix = prefix.removeprefix("op_").split("_", 1)[0]
        key = ApiKey.objects.filter(prefix=prefix).first()
        if key is None:
            raise CommandError(f"no API key with prefix {prefix!r}")
        with transaction.atomic():
            if not key.revoke():
                raise CommandError(f"API key op_{prefix}_… was already revoked")
            AuditEvent.record(actor="system:revoke_api_key", action="api_key.revoked", target=key)
        self.stdout.write(f"revoked op_{prefix}_…")
