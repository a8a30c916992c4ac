"""`manage.py dlq_redrive`: bulk redrive of open dead letters, paced, with a progress bar on stderr."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from core.management.tenants import resolve_tenant
from core.validation import NAME, parse_aware_datetime
from dlq import services
from dlq.models import FailureClass

ACTOR = "system:dlq_redrive"


def _positive(value: str | None, name: str, kind: type) -> Any:
    if value is None:
        return None
    try:
        number = kind(value)
    except ValueError:
        raise CommandError(f"{name} must be a {'whole ' if kind is int else ''}number, got {value!r}") from None
    if not number > 0 or number != number or number == float("inf"):
        raise CommandError(f"{name} must be greater than 0, got {value!r}")
    return number


class Command(BaseCommand):
    help = (
        "Redrive open dead-letter entries (oldest first) whose notification failed or was dead-lettered. "
        "Runs in batches of one short transaction each; --rate paces them so a recovering provider is not "
        "flooded. Ctrl-C stops after the current batch."
    )

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        # Values are parsed here, not by argparse, so bad input is one readable line (CommandError).
        parser.add_argument("--tenant", help="tenant id or name (default: every tenant)")
        parser.add_argument("--failure-class", help="transient or permanent")
        parser.add_argument("--provider", help="provider name")
        parser.add_argument("--since", help="only entries created at or after this ISO 8601 time (with offset)")
        parser.add_argument("--limit", help="redrive at most N entries")
        parser.add_argument("--rate", help="entries per second (default: as fast as batches go)")
        parser.add_argument("--dry-run", action="store_true", help="only count what would be redriven")

    def handle(self, *args: Any, **options: Any) -> None:
        filters = self._filters(options)
        limit = _positive(options["limit"], "--limit", int)
        rate = _positive(options["rate"], "--rate", float)
        stop = threading.Event()
        bar: tqdm | None = None

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, unit="entry", desc="redrive", file=self.stderr._out, disable=False)
            bar.update(done - bar.n)

        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def on_signal(sig: int, frame: FrameType | None) -> None:
            if stop.is_set():  # a second signal: stop now
                raise KeyboardInterrupt
            self.stderr.write(f"\n{signal.Signals(sig).name}: stopping after the current batch")
            stop.set()

        for sig in previous:
            signal.signal(sig, on_signal)
        try:
            result = services.redrive_matching(
                filters, actor=ACTOR, limit=limit, rate=rate, dry_run=options["dry_run"], progress=progress, stop=stop
            )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if bar is not None:
                bar.close()
        if result.dry_run:
            noun = "entry" if result.matched == 1 else "entries"
            self.stdout.write(f"dry run: {result.matched} {noun} would be redriven")
            return
        refused = ", ".join(f"{n} {code}" for code, n in sorted(result.refused.items())) or "none"
        self.stdout.write(
            f"redriven {result.redriven} of {result.matched} matching entries in {result.seconds:.1f}s "
            f"({result.batches} batches); refused: {refused}"
        )
        if result.interrupted:
            raise CommandError(f"interrupted: {result.matched - result.redriven} entries were not redriven")

    def _filters(self, options: dict[str, Any]) -> services.RedriveFilters:
        failure_class = options["failure_class"]
        if failure_class is not None and failure_class not in FailureClass.values:
            choices = ", ".join(FailureClass.values)
            raise CommandError(f"--failure-class must be one of {choices}, got {failure_class!r}")
        provider = options["provider"]
        if provider is not None and not NAME.fullmatch(provider):
            raise CommandError(f"--provider must be a provider name, got {provider!r}")
        since = None
        if options["since"] is not None:
            try:
                since = parse_aware_datetime(options["since"])
            except ValueError as exc:
                raise CommandError(f"--since {exc}") from None
        tenant = resolve_tenant(options["tenant"]) if options["tenant"] is not None else None
        return services.RedriveFilters(
            tenant=tenant, failure_class=failure_class, provider=provider, created_after=since
        )
