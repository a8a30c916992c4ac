from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core import tracing
from core.process_name import set_process_name
from dispatch.dispatcher import Dispatcher, DispatcherConfig


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = "Lease queued notifications and deliver them until SIGTERM/SIGINT (see README)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--queues", help="comma-separated queue names (default: all queues)")
        parser.add_argument("--concurrency", type=_positive_int, default=100, help="deliveries in flight")
        parser.add_argument("--batch-size", type=_positive_int, default=100, help="items per claim")
        parser.add_argument("--grace-seconds", type=float, default=10.0, help="time to finish in-flight work")
        parser.add_argument("--once", action="store_true", help="deliver what is ready now, then exit")
        parser.add_argument("--max-items", type=_positive_int, help="exit after this many items")
        parser.add_argument("--lease-seconds", type=float, help="default: OMNIPOST_LEASE_SECONDS")
        parser.add_argument("--no-jitter", action="store_true", help="skip the random start-up delay")
        parser.add_argument("--no-listen", action="store_true", help="poll only; no LISTEN/NOTIFY wake-ups")
        parser.add_argument("--no-events", action="store_true", help="do not deliver tenants' event webhooks here")
        parser.add_argument("--event-concurrency", type=_positive_int, default=100, help="event sends in flight")

    def handle(self, *args, **options) -> None:
        set_process_name("omnipost-disp")  # before the dispatcher's threads start: they inherit it
        config = config_from(options)
        tracing.configure("dispatcher")  # with OTEL_EXPORTER_OTLP_ENDPOINT set: spans of claims and sends
        try:
            status = Dispatcher(config).run()
        finally:
            tracing.shutdown()  # its last spans go out before the process ends
        if status != 0:
            raise CommandError("the dispatcher stopped after an internal error; see the log above")


def config_from(options: dict) -> DispatcherConfig:
    """The DispatcherConfig these command-line options ask for (benchmarks.dispatcher uses it too)."""
    queues = [q.strip() for q in (options["queues"] or "").split(",") if q.strip()] or None
    if options["grace_seconds"] < 0:
        raise CommandError("--grace-seconds must be zero or more")
    config = DispatcherConfig(
        queues=queues,
        concurrency=options["concurrency"],
        batch_size=options["batch_size"],
        grace_seconds=options["grace_seconds"],
        once=options["once"],
        max_items=options["max_items"],
        jitter=not options["no_jitter"],
        listen=not options["no_listen"],
        event_lane=not options.get("no_events", False),
        event_concurrency=options.get("event_concurrency") or 100,
    )
    if options["lease_seconds"] is not None:
        if options["lease_seconds"] <= 0:
            raise CommandError("--lease-seconds must be positive")
        config.lease_seconds = options["lease_seconds"]
    return config
