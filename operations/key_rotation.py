"""Key rotation: every encrypted column re-encrypted with the newest `OMNIPOST_ENCRYPTION_KEYS` key.

Re-runnable: a value already under the newest key is left alone. Each page of `batch_size` rows is
read outside a transaction and written in one short transaction, every write a compare-and-set on
the token read, so a value a concurrent writer changed meanwhile is not overwritten (it is already
under the newest key: writers always encrypt with it). A value no configured key can read stops the
rotation with a `crypto.DecryptionError` naming model, field and row; pages before it stay rotated.
Then the keyed blind indexes (the suppression list's, `recipients.suppressions.recompute_indexes`)
are recomputed under the newest key. `manage.py rotate_encryption_keys` parses its flags and calls `rotate`.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import models, transaction

from core import crypto
from core.fields import Ciphertext, encrypted_fields
from recipients import suppressions
from recipients.models import Suppression

DEFAULT_BATCH = 1000

# Called once per encrypted column with its label (`app.Model.field`) and how many rows hold a
# value; returns a function that is told how many of those rows each page covered.
ProgressFactory = Callable[[str, int], Callable[[int], object]]


def _no_progress(label: str, total: int) -> Callable[[int], object]:
    return lambda n: None


def rotate_column(
    model: type[models.Model], field: models.Field, *, batch_size: int = DEFAULT_BATCH,
    progress: Callable[[int], object] = lambda n: None,
) -> int:  # fmt: skip
    """Re-encrypt one column, keyset-paged by primary key; returns how many values it rewrote (a value
    a concurrent writer replaced meanwhile is not counted: the writer already used the newest key)."""
    label = f"{model._meta.label}.{field.name}"
    rows_with_values = model._default_manager.exclude(**{f"{field.attname}__isnull": True}).order_by("pk")
    changed_total = 0
    last_pk = None
    while True:
        page = rows_with_values if last_pk is None else rows_with_values.filter(pk__gt=last_pk)
        rows = list(page.values_list("pk", field.attname)[:batch_size])
        if not rows:
            return changed_total
        last_pk = rows[-1][0]
        changed = {
            pk: Ciphertext(crypto.rotate(token, where=f"{label} of row {pk}"))
            for pk, token in rows
            if not crypto.is_current(token)
        }
        old_tokens = dict(rows)
        with transaction.atomic():
            for pk, token in changed.items():
                changed_total += model._default_manager.filter(pk=pk, **{field.attname: old_tokens[pk]}).update(
                    **{field.attname: token}
                )
        progress(len(rows))


def rotate(*, batch_size: int = DEFAULT_BATCH, progress: ProgressFactory = _no_progress) -> int:
    """Re-encrypt every encrypted column (`core.fields.encrypted_fields`); returns how many values changed."""
    total = 0
    for model, field in encrypted_fields():
        label = f"{model._meta.label}.{field.name}"
        count = model._default_manager.exclude(**{f"{field.attname}__isnull": True}).count()
        total += rotate_column(model, field, batch_size=batch_size, progress=progress(label, count))
    count = Suppression.objects.count()
    total += suppressions.recompute_indexes(
        batch_size=batch_size, progress=progress("notifications.Suppression.recipient_index", count)
    )
    return total
