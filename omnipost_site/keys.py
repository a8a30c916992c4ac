"""Loading the Fernet keys for encryption at rest (OMNIPOST_ENCRYPTION_KEYS, newest first)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured


def parse_keys(raw: str) -> list[str]:
    """Split and validate a comma-separated key list; raise one readable line on bad input."""
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    for index, key in enumerate(keys, start=1):
        try:
            Fernet(key.encode())
        except (ValueError, TypeError):
            raise ImproperlyConfigured(
                f"OMNIPOST_ENCRYPTION_KEYS: key #{index} is not a valid Fernet key "
                "(32 url-safe base64-encoded bytes; make one with "
                "`python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`)"
            ) from None
    return keys


def load_encryption_keys(raw: str, *, debug: bool, dev_key_file: Path) -> list[str]:
    """Keys from the environment; in DEBUG only, a dev key generated once into `var/`."""
    if raw.strip():
        return parse_keys(raw)
    if not debug:
        raise ImproperlyConfigured("OMNIPOST_ENCRYPTION_KEYS is required when DEBUG is off")
    if not dev_key_file.exists():
        _create_once(dev_key_file, Fernet.generate_key().decode())
    return parse_keys(dev_key_file.read_text())


def _create_once(path: Path, content: str) -> None:
    """Write `path` whole or not at all: the processes of one checkout start together (`make run`),
    and a reader must never see the file created but still empty. The key goes to a private file
    first, then is linked into place, which fails for every process but the first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(content)
        with contextlib.suppress(FileExistsError):
            os.link(draft, path)
    finally:
        draft.unlink(missing_ok=True)
