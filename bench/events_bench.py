"""Event webhooks' cost to notification delivery, and their own delivery rate.

    DATABASE_URL=postgres://… .venv/bin/python bench/events_bench.py [--rounds 3] [-n 40000] [--json FILE]

Each round runs `manage.py omnipost_bench` (2 dispatcher processes, -c 2000 -b 1000, the receiver
checking every 20th signature, as bench/versus.py runs OmniPost) twice, alternating which goes
first: once for a tenant without event endpoints, once with an endpoint subscribed to every type
on a receiver of its own (`--event-endpoints`: every delivery makes a notification.delivered
event, signed and delivered by the dispatchers' event lane). Reported: the notification delivery
rate of both (median, and with / without), and the events delivered per second. Any duplicate or
lost notification or event fails the run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(count: int, events: bool) -> dict:
    env = {**os.environ, "DEBUG": os.environ.get("DEBUG", "true"), "OMNIPOST_LOG_LEVEL": "WARNING"}
    with tempfile.TemporaryDirectory(prefix="events-bench-") as tmp:
        out = Path(tmp) / "result.json"
        args = ["-n", str(count), "-p", "2", "-c", "2000", "-b", "1000", "--verify-every", "20", "--json", str(out)]
        if events:
            args.append("--event-endpoints")
        proc = subprocess.run(  # noqa: S603
            [sys.executable, "manage.py", "omnipost_bench", *args], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"events_bench: omnipost_bench failed: {proc.stderr.strip()[-500:]}")
        (result,) = json.loads(out.read_text())
    if result["duplicates"] or result["lost"] or (events and (result["event_duplicates"]
                                                              or result["events_delivered"] != count)):  # fmt: skip
        raise SystemExit(f"events_bench: invalid run: {result}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/events_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", "--notifications", type=int, default=40_000)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    rounds = []
    for round_no in range(1, args.rounds + 1):
        order = (False, True) if round_no % 2 else (True, False)
        entry = {}
        for events in order:
            result = run(args.notifications, events)
            entry["with" if events else "without"] = result
            print(f"round {round_no}, {'with' if events else 'without'} endpoints: "
                  f"{result['delivered_per_second']:,.0f} notifications/s"
                  + (f", {result['events_per_second']:,.0f} events/s" if events else ""),
                  file=sys.stderr, flush=True)  # fmt: skip
        entry["ratio"] = entry["with"]["delivered_per_second"] / entry["without"]["delivered_per_second"]
        rounds.append(entry)
    without = statistics.median(r["without"]["delivered_per_second"] for r in rounds)
    with_ = statistics.median(r["with"]["delivered_per_second"] for r in rounds)
    events = statistics.median(r["with"]["events_per_second"] for r in rounds)
    steady = statistics.median(r["with"]["events_steady_per_second"] or 0 for r in rounds)
    print(f"| {args.notifications:,} per run, {args.rounds} rounds | notifications /s | events /s (middle 80 %) |")
    print("|---|---|---|")
    print(f"| without event endpoints | {without:,.0f} | — |")
    print(f"| with an endpoint for every type | {with_:,.0f} | {events:,.0f} ({steady:,.0f}) |")
    print(f"| with / without | {with_ / without:.2f} (median of the rounds' ratios "
          f"{statistics.median(r['ratio'] for r in rounds):.2f}) | |")  # fmt: skip
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rounds, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
