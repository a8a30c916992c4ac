from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from tqdm import tqdm

from core import crypto
from core.fields import Ciphertext, encrypted_fields


class Command(BaseCommand):
    help = "Re-encrypt every encrypted value with the newest OMNIPOST_ENCRYPTION_KEYS key (re-runnable)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--batch-size", type=int, default=1000)

    def handle(self, *args, batch_size: int, **options) -> None:
        total = 0
        for model, field in encrypted_fields():
            label = f"{model._meta.label}.{field.name}"
            qs = model._default_manager.exclude(**{f"{field.attname}__isnull": True})
            # Always drawn (also when stderr is a log file), so an operator can see rotation advance.
            progress = tqdm(total=qs.count(), desc=label, unit="row", file=self.stderr._out, disable=False)
            last_pk = None
            while True:
                page = qs.order_by("pk")
                if last_pk is not None:
                    page = page.filter(pk__gt=last_pk)
                rows = list(page.values_list("pk", field.attname)[:batch_size])
                if not rows:
                    break
                last_pk = rows[-1][0]
                try:
                    changed = {
                        pk: Ciphertext(crypto.rotate(token, where=f"{label} of row {pk}"))
                        for pk, token in rows
                        if not crypto.is_current(token)
                    }
                except crypto.DecryptionError as exc:
                    raise CommandError(str(exc)) from None
                old_tokens = dict(rows)
                with transaction.atomic():
                    for pk, token in changed.items():
                        # Compare-and-set on the old token: a concurrent writer's value is not overwritten.
                        old = old_tokens[pk]
                        model._default_manager.filter(pk=pk, **{field.attname: old}).update(**{field.attname: token})
                total += len(changed)
                progress.update(len(rows))
            progress.close()
        self.stdout.write(f"re-encrypted {total} value(s) with the newest key")
