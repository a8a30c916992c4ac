"""CPU per kind of process over the busy part of a run, from `perf record -a`.

    .venv/bin/python bench/cpu_window.py --busy node [--rate 16000] -- \
        .venv/bin/python bench/versus.py --only graphile --rounds 1
    .venv/bin/python bench/cpu_window.py --busy omnipost-disp [--rate 15000] -- \
        .venv/bin/python manage.py omnipost_bench -n 60000 -p 2 -c 500 -b 250 --verify-every 20

`bench/cpu_split.py` counts whole processes, start-up and enqueue included; this counts only the
delivery: every CPU sample of the machine (999 Hz) is put in a 0.25 s bin by time, the bins where
the `--busy` command (the system's workers: `node` for graphile-worker, `omnipost-disp` for
OmniPost's dispatchers; the bench receiver is `bench-receiver`) has more than half its peak form the
window, and its first and last two bins are dropped
(ramp-up and tail). Prints each command's share of the CPU in that window and, given `--rate`
(deliveries per second in the run), microseconds per delivery on this machine's cores. Needs
`perf` and the right to sample every CPU (root here).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BIN_SECONDS = 0.25


def busy_window(samples: list[tuple[str, float]], busy: str) -> collections.Counter:
    bins: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for comm, at in samples:
        bins[int(at / BIN_SECONDS)][comm] += 1
    peak = max((c[busy] for c in bins.values()), default=0)
    window = [b for b in sorted(bins) if peak and bins[b][busy] > peak / 2][2:-2]
    total: collections.Counter = collections.Counter()
    for b in window:
        total.update(bins[b])
    return total


def read_samples(perf_data: Path) -> list[tuple[str, float]]:
    out = subprocess.run(  # noqa: S603
        ["perf", "script", "-i", str(perf_data), "-F", "comm,time"],  # noqa: S607
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    samples = []
    for line in out.splitlines():
        comm, _, at = line.rstrip().rstrip(":").rpartition(" ")
        if comm.strip():
            samples.append((comm.strip(), float(at)))
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", required=True, help="command name of the system's workers (node, omnipost-disp)")
    parser.add_argument("--rate", type=float, help="deliveries per second in the run: also print µs per delivery")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        run = subprocess.run(["perf", "record", "-a", "-F", "999", "-q", "-o", str(data), "--", *command])  # noqa: S603, S607
        if run.returncode != 0:
            print(f"cpu_window: the command exited {run.returncode}", file=sys.stderr)
            return run.returncode
        total = busy_window(read_samples(data), args.busy)
    samples = sum(total.values())
    if not samples:
        print(f"cpu_window: no busy window for {args.busy!r}", file=sys.stderr)
        return 1
    cores = os.cpu_count() or 1
    print(f"busy window: {samples:,} samples; share of all CPU ({cores} cores) per command:")
    for comm, n in total.most_common(6):
        per = f"  {n / samples * cores / args.rate * 1e6:7.1f} µs per delivery" if args.rate else ""
        print(f"  {comm:16s} {n / samples:6.1%}{per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
