"""`manage.py run_scheduler`: promotes due scheduled jobs; safe to run several at once."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core import tracing
from queueing.scheduler import DEFAULT_BATCH_SIZE, DEFAULT_INTERVAL, DEFAULT_JITTER, Scheduler


class Command(BaseCommand):
    help = (
        "Promote due scheduled jobs to the queue. Sleeps until the next job is due (woken early by "
        "newly scheduled jobs); SIGTERM/SIGINT finish the current batch and exit."
    )

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument(
            "--interval",
            type=float,
            default=DEFAULT_INTERVAL,
            help=f"longest sleep between looks at the table, in seconds (default {DEFAULT_INTERVAL:g})",
        )
        parser.add_argument("--once", action="store_true", help="promote everything due now, then exit")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"jobs promoted per transaction (default {DEFAULT_BATCH_SIZE})",
        )
        parser.add_argument(
            "--no-jitter",
            action="store_true",
            help=f"start at once instead of after a random delay of up to {DEFAULT_JITTER:g}s",
        )

    def handle(self, *args, interval: float, once: bool, batch_size: int, no_jitter: bool, **options) -> None:
        if interval <= 0:
            raise CommandError("--interval must be a positive number of seconds, e.g. --interval 5")
        if batch_size <= 0:
            raise CommandError("--batch-size must be a positive integer, e.g. --batch-size 1000")
        tracing.configure("scheduler")  # with OTEL_EXPORTER_OTLP_ENDPOINT set: a span per promotion
        scheduler = Scheduler(batch_size=batch_size, interval=interval, jitter=0.0 if no_jitter else DEFAULT_JITTER)
        try:
            scheduler.run(once=once)
        finally:
            tracing.shutdown()
