"""`manage.py prune`: parses its flags and runs `operations.retention` (what goes, what stays and
how each batch is bounded are written there)."""

from __future__ import annotations

import math
import signal
import threading
import time
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError
from tqdm import tqdm

from operations import retention


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise CommandError(f"--older-than must be a number of days, got {value!r}") from None
    if not math.isfinite(days) or days < 0:
        raise CommandError(f"--older-than must be zero or more days, got {value!r}")
    return days


def _batch_size(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise CommandError(f"--batch-size must be a whole number, got {value!r}") from None
    if not 1 <= size <= retention.MAX_BATCH:
        raise CommandError(f"--batch-size must be between 1 and {retention.MAX_BATCH:,}, got {value!r}")
    return size


class Command(BaseCommand):
    help = (
        "Drop the history partitions (delivery attempts, receipt events) wholly past retention and delete their "
        "older rows beside newer ones; delete finished notifications (with their attempts, closed dead letters "
        "and scheduled jobs), done scheduled jobs and expired idempotency records past retention, in short "
        "batches. Live notifications, "
        "open dead letters and the audit log are never touched. Ctrl-C stops after the current batch."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        # Values are checked in handle(), so bad input is one readable line (CommandError).
        days, batch = retention.DEFAULT_DAYS, retention.DEFAULT_BATCH
        parser.add_argument("--older-than", default=str(days), metavar="DAYS",
                            help=f"retention in days since a notification finished (default {days:g})")
        parser.add_argument("--batch-size", default=str(batch), metavar="N",
                            help=f"rows per transaction (default {batch:,})")
        parser.add_argument("--dry-run", action="store_true", help="only count what would be deleted")

    def handle(self, *args: Any, **options: Any) -> None:
        pruner = retention.Pruner(
            older_than_days=_days(options["older_than"]), batch_size=_batch_size(options["batch_size"])
        )
        if options["dry_run"]:
            would = retention.dry_run(pruner)
            self.stdout.write(
                f"dry run: would delete {would.notifications:,} finished notification(s) older than "
                f"{would.days:g} day(s) with {would.attempts:,} attempt(s), {would.jobs:,} other done "
                f"scheduled job(s) and {would.idempotency:,} expired idempotency record(s)"
            )
            if any(n for _, n in would.retained):
                self.stdout.write("dry run: would delete " + ", ".join(f"{n:,} {label}" for label, n in would.retained))
            if would.partitions or would.history_rows:
                self.stdout.write(
                    f"dry run: would drop {len(would.partitions)} history partition(s)"
                    + "".join(f"\n  {name} (~{rows:,} row(s))" for name, rows in would.partitions)
                    + f"\ndry run: would delete {would.history_rows:,} older history row(s) beside newer ones"
                )
            return
        stop = threading.Event()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def on_signal(sig: int, frame: FrameType | None) -> None:
            if stop.is_set():
                raise KeyboardInterrupt
            self.stderr.write(f"\n{signal.Signals(sig).name}: stopping after the current batch")
            stop.set()

        for sig in previous:
            signal.signal(sig, on_signal)
        started = time.perf_counter()
        try:
            totals = retention.prune(pruner, stop=stop, progress=self._bar)
        except OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CommandError(f"prune stopped: {first}; the batches before are committed, run it again") from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.stdout.write(
            f"pruned {totals.notifications:,} notification(s) with {totals.attempts:,} attempt(s), "
            f"{totals.dead_letters:,} closed dead letter(s) and {totals.jobs:,} scheduled job(s); "
            f"{totals.idempotency:,} expired idempotency record(s); dropped {totals.partitions_dropped} history "
            f"partition(s) (~{totals.partition_rows:,} row(s)) and deleted {totals.history_rows:,} older history "
            f"row(s) beside newer ones; "
            + ("deleted " + ", ".join(f"{n:,} {label}" for label, n in totals.retained.items()) + "; "
               if totals.retained else "")
            + f"{totals.batches} batch(es) in "
            f"{time.perf_counter() - started:.1f}s, longest batch {totals.longest_batch:.3f}s"
        )
        if totals.interrupted:
            raise CommandError("interrupted: run prune again to finish")

    def _bar(self, total: int, desc: str) -> tqdm:
        # Always drawn (also when stderr is a log file), so an operator can see it advance.
        return tqdm(total=total, desc=desc, unit="row", file=self.stderr._out, disable=False)
