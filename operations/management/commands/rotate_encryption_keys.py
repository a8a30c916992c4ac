"""`manage.py rotate_encryption_keys`: parses its flags and runs `operations.key_rotation`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from core import crypto
from operations import key_rotation


class Command(BaseCommand):
    help = "Re-encrypt every encrypted value with the newest OMNIPOST_ENCRYPTION_KEYS key (re-runnable)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--batch-size", type=int, default=key_rotation.DEFAULT_BATCH)

    def handle(self, *args: Any, batch_size: int, **options: Any) -> None:
        if batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1, got {batch_size}")
        with self._bars() as progress:
            try:
                total = key_rotation.rotate(batch_size=batch_size, progress=progress)
            except crypto.DecryptionError as exc:
                raise CommandError(str(exc)) from None
        self.stdout.write(f"re-encrypted {total} value(s) with the newest key")

    @contextmanager
    def _bars(self) -> Iterator[Callable[[str, int], Callable[[int], object]]]:
        """One bar per encrypted column, each closed when the next starts (and at the end)."""
        bars: list[tqdm] = []

        def progress(label: str, total: int) -> Callable[[int], object]:
            if bars:
                bars.pop().close()
            # Always drawn (also when stderr is a log file), so an operator can see rotation advance.
            bars.append(tqdm(total=total, desc=label, unit="row", file=self.stderr._out, disable=False))
            return bars[-1].update

        try:
            yield progress
        finally:
            for bar in bars:
                bar.close()
