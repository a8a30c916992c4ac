from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core import services
from core.models import ApiKey


class Command(BaseCommand):
    help = "Revoke an API key by its 8-character prefix (the part after `op_` or `op_test_`)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("prefix")

    def handle(self, *args, prefix: str, **options) -> None:
        prefix = prefix.removeprefix("op_").removeprefix("test_").split("_", 1)[0]
        key = ApiKey.objects.filter(prefix=prefix).first()
        if key is None:
            raise CommandError(f"no API key with prefix {prefix!r}")
        try:
            services.revoke_api_key(key, actor="system:revoke_api_key")
        except services.ApiKeyAlreadyRevoked as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"revoked {key.key_start}{prefix}_…")
