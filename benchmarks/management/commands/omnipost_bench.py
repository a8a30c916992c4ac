from __future__ import annotations

import json
import statistics
import sys

from django.core.management.base import BaseCommand, CommandError

from benchmarks import runner


class Command(BaseCommand):
    help = "End-to-end benchmark on the configured database (see docs/PERFORMANCE.md)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--notifications", "-n", type=int, default=20_000)
        parser.add_argument("--processes", "-p", type=int, default=2, help="dispatcher processes")
        parser.add_argument("--concurrency", "-c", type=int, default=200, help="deliveries in flight per process")
        parser.add_argument("--batch-size", "-b", type=int, default=200)
        parser.add_argument("--receiver-delay-ms", type=float, default=0.0)
        parser.add_argument("--receiver-error-rate", type=float, default=0.0, help="share answered 503 (retried)")
        parser.add_argument("--verify-every", type=int, default=1, help="receiver checks every Nth signature")
        parser.add_argument("--rounds", type=int, default=1, help="repeat and report the median")
        parser.add_argument("--pickup", action="store_true", help="pickup latency into idle dispatchers")
        parser.add_argument("--rate", type=float, default=50.0, help="--pickup: notifications per second")
        parser.add_argument("--breakdown", action="store_true",
                            help="--pickup: the median of each step from the create's return to arrival")
        parser.add_argument("--no-listen", action="store_true", help="--pickup: dispatchers poll, no LISTEN")
        parser.add_argument("--queue-only", action="store_true", help="claim+ack of no-op items, no delivery")
        parser.add_argument("--depth", type=int, default=1000, help="--queue-only: items waiting beneath")
        parser.add_argument("--event-endpoints", action="store_true",
                            help="the tenant has an event endpoint subscribed to every type (its own receiver)")
        parser.add_argument("--failover", action="store_true",
                            help="two providers in failover order; the notifications name neither")
        parser.add_argument("--json", dest="json_path", help="also write the figures to this file")
        parser.add_argument(
            "--phase-gate", action="store_true",
            help="e2e: at the start of the delivery phase and at the drain, print a JSON line "
            '{"phase": …, "pids": [dispatchers]} and wait for a line on stdin (bench/per_delivery.py '
            "measures between the two)",
        )  # fmt: skip

    def handle(self, *args, **o) -> None:
        for name in ("notifications", "processes", "concurrency", "batch_size", "rounds", "verify_every"):
            if o[name] < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1")
        results = []
        for round_no in range(1, o["rounds"] + 1):
            if o["queue_only"]:
                result = runner.run_queue_only(
                    count=o["notifications"], processes=o["processes"], batch=o["batch_size"], depth=o["depth"]
                )
            elif o["pickup"]:
                result = runner.run_pickup(
                    count=o["notifications"],
                    rate=o["rate"],
                    processes=o["processes"],
                    concurrency=o["concurrency"],
                    batch=o["batch_size"],
                    listen=not o["no_listen"],
                    breakdown=o["breakdown"],
                )
            else:
                result = runner.run_e2e(
                    count=o["notifications"],
                    processes=o["processes"],
                    concurrency=o["concurrency"],
                    batch=o["batch_size"],
                    delay_ms=o["receiver_delay_ms"],
                    error_rate=o["receiver_error_rate"],
                    verify_every=o["verify_every"],
                    event_endpoints=o["event_endpoints"],
                    failover=o["failover"],
                    gate=self.phase_gate if o["phase_gate"] else None,
                )
            self.stdout.write(f"\n--- round {round_no} ---\n{result.table()}")
            results.append(result)
        if len(results) > 1:
            rates = [r.delivered_per_second or 0 for r in results]
            self.stdout.write(
                f"\nmedian rate of {len(results)} rounds: {statistics.median(rates):,.0f} /s "
                f"(rounds: {', '.join(f'{r:,.0f}' for r in rates)})"
            )
        if o["json_path"]:
            with open(o["json_path"], "w") as fh:
                json.dump([r.as_dict() for r in results], fh, indent=2, default=str)
        bad = [r for r in results if not r.ok]
        if bad:
            raise CommandError(
                f"{sum(r.duplicates for r in bad)} duplicate(s) and {sum(r.lost for r in bad)} "
                "lost notification(s): the run is invalid"
            )

    def phase_gate(self, phase: str, pids: list[int]) -> None:
        self.stdout.write(json.dumps({"phase": phase, "pids": pids}))
        self.stdout.flush()
        if not sys.stdin.readline():
            raise CommandError(f"stdin closed at the {phase!r} phase gate")
