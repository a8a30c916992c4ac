"""Model fields whose values are stored only as Fernet tokens.

Values decrypt lazily on attribute access, so a row is loaded without touching the key and a
failure can name the model, field and row it came from.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models

from core import crypto


class Ciphertext(str):
    """A Fernet token as read from the database (never plaintext)."""


class _DecryptingAttribute:
    def __init__(self, field: EncryptedTextField) -> None:
        self.field = field

    def __get__(self, instance: models.Model | None, owner: type) -> Any:
        if instance is None:
            return self
        if self.field.attname not in instance.__dict__:  # deferred with .only()/.defer()
            instance.refresh_from_db(fields=[self.field.attname])
        value = instance.__dict__.get(self.field.attname)
        if isinstance(value, Ciphertext):
            where = f"{owner.__name__}.{self.field.name} of row {instance.pk}"
            value = self.field.from_plaintext(crypto.decrypt(value, where=where))
            instance.__dict__[self.field.attname] = value
        return value

    def __set__(self, instance: models.Model, value: Any) -> None:
        instance.__dict__[self.field.attname] = value


class EncryptedTextField(models.TextField):
    """Text encrypted at rest. `.values()` and raw SQL see only the token."""

    def contribute_to_class(self, cls: type[models.Model], name: str, *args: Any, **kwargs: Any) -> None:
        super().contribute_to_class(cls, name, *args, **kwargs)
        setattr(cls, self.attname, _DecryptingAttribute(self))

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        # Read the stored value without the decrypting descriptor: saving a loaded row must write its
        # token back unchanged, not decrypt and re-encrypt it (or fail when its key is gone).
        return model_instance.__dict__.get(self.attname)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return None if value is None else Ciphertext(value)

    def to_plaintext(self, value: Any) -> str:
        return str(value)

    def from_plaintext(self, text: str) -> Any:
        return text

    def get_prep_value(self, value: Any) -> Any:
        if value is None or isinstance(value, Ciphertext):
            return value
        return crypto.encrypt(self.to_plaintext(value))

    def value_to_string(self, obj: models.Model) -> str:
        return "****"


class EncryptedJSONField(EncryptedTextField):
    """A JSON document (e.g. provider secrets) encrypted as one token."""

    def to_plaintext(self, value: Any) -> str:
        return json.dumps(value, sort_keys=True)

    def from_plaintext(self, text: str) -> Any:
        return json.loads(text)


def encrypted_fields() -> list[tuple[type[models.Model], EncryptedTextField]]:
    """Every (model, field) pair stored encrypted, for key rotation."""
    from django.apps import apps

    return [
        (model, field)
        for model in apps.get_models()
        for field in model._meta.concrete_fields
        if isinstance(field, EncryptedTextField)
    ]
