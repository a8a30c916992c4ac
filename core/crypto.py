"""Fernet encryption at rest with MultiFernet key rotation (keys from settings, newest first)."""

from __future__ import annotations

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class DecryptionError(Exception):
    """A stored value could not be decrypted with any configured key."""


@lru_cache(maxsize=4)
def _multifernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(k.encode()) for k in keys])


@lru_cache(maxsize=4)
def _primary(keys: tuple[str, ...]) -> Fernet:
    return Fernet(keys[0].encode())


def _keys() -> tuple[str, ...]:
    return tuple(settings.OMNIPOST_ENCRYPTION_KEYS)


def encrypt(plaintext: str) -> str:
    return _multifernet(_keys()).encrypt(plaintext.encode()).decode()


def decrypt(token: str, *, where: str = "a value") -> str:
    try:
        return _multifernet(_keys()).decrypt(token.encode()).decode()
    except InvalidToken:
        raise DecryptionError(
            f"cannot decrypt {where}: no configured OMNIPOST_ENCRYPTION_KEYS entry matches "
            "(was it encrypted under a key that has since been removed?)"
        ) from None


def is_current(token: str) -> bool:
    """True when the token is already encrypted under the newest key."""
    try:
        _primary(_keys()).decrypt(token.encode())
    except InvalidToken:
        return False
    return True


def rotate(token: str, *, where: str = "a value") -> str:
    try:
        return _multifernet(_keys()).rotate(token.encode()).decode()
    except InvalidToken:
        raise DecryptionError(f"cannot re-encrypt {where}: no configured key matches") from None
