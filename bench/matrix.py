"""Run the benchmark matrices the issues ask for and print one markdown table per matrix.

    DATABASE_URL=postgres://… .venv/bin/python bench/matrix.py queue      # claim+ack: processes × batch × depth
    DATABASE_URL=postgres://… .venv/bin/python bench/matrix.py dispatch   # one process: concurrency × receiver latency
    DATABASE_URL=postgres://… .venv/bin/python bench/matrix.py pickup     # LISTEN/NOTIFY vs polling
    DATABASE_URL=postgres://… .venv/bin/python bench/matrix.py e2e        # 2 processes, 0 ms and 100 ms receivers

Each cell is one `manage.py omnipost_bench … --json` run (median of --rounds when given).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench(*args: str) -> list[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {**os.environ, "DEBUG": os.environ.get("DEBUG", "true"), "OMNIPOST_LOG_LEVEL": "WARNING"}
        subprocess.run(  # noqa: S603
            [sys.executable, "manage.py", "omnipost_bench", *args, "--json", out.name],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return json.loads(Path(out.name).read_text())


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] or 0 for r in runs)


def queue_matrix(rounds: int) -> None:
    print("| depth | processes | batch | claim+ack /s |")
    print("|---|---|---|---|")
    counts = {1: 4000, 10: 20000, 100: 50000}
    for depth in (1_000, 1_000_000):
        for processes in (1, 2, 4):
            for batch in (1, 10, 100):
                if depth == 1_000_000 and batch != 100:
                    continue  # flatness with depth is shown on the fastest configuration
                runs = bench(
                    "--queue-only",
                    "-n",
                    str(counts[batch]),
                    "-p",
                    str(processes),
                    "-b",
                    str(batch),
                    "--depth",
                    str(depth),
                    "--rounds",
                    str(rounds),
                )
                print(
                    f"| {depth:,} | {processes} | {batch} | {median(runs, 'delivered_per_second'):,.0f} |", flush=True
                )


def dispatch_matrix(rounds: int) -> None:
    print("| receiver | concurrency | delivered /s (1 process) |")
    print("|---|---|---|")
    for delay in (0, 100):
        for concurrency in (1, 50, 200):
            rate_guess = {0: {1: 400, 50: 2000, 200: 2500}, 100: {1: 9, 50: 450, 200: 1800}}[delay][concurrency]
            count = max(50, int(rate_guess * 8))
            runs = bench(
                "-n",
                str(count),
                "-p",
                "1",
                "-c",
                str(concurrency),
                "-b",
                str(max(concurrency, 10)),
                "--receiver-delay-ms",
                str(delay),
                "--rounds",
                str(rounds),
            )
            print(f"| {delay} ms | {concurrency} | {median(runs, 'delivered_per_second'):,.0f} |", flush=True)


def pickup(rounds: int) -> None:
    print("| wake-up | p50 ms | p95 ms | p99 ms |")
    print("|---|---|---|---|")
    for label, extra in (("LISTEN/NOTIFY", []), ("polling only", ["--no-listen"])):
        runs = bench("--pickup", "-n", "300", "--rate", "50", *extra, "--rounds", str(rounds))
        lat = {k: statistics.median(r["latency_ms"][k] for r in runs) for k in ("p50", "p95", "p99")}
        print(f"| {label} | {lat['p50']:.2f} | {lat['p95']:.2f} | {lat['p99']:.2f} |", flush=True)


def e2e(rounds: int) -> None:
    print("| receiver | delivered /s (2 processes) | statements / delivery | duplicates | lost |")
    print("|---|---|---|---|---|")
    for delay, count in ((0, 40000), (100, 40000)):
        runs = bench(
            "-n",
            str(count),
            "-p",
            "2",
            "-c",
            "500",
            "-b",
            "250",
            "--receiver-delay-ms",
            str(delay),
            "--rounds",
            str(rounds),
        )
        print(
            f"| {delay} ms | {median(runs, 'delivered_per_second'):,.0f} | "
            f"{median(runs, 'statements_per_delivery'):.3f} | {sum(r['duplicates'] for r in runs)} | "
            f"{sum(r['lost'] for r in runs)} |",
            flush=True,
        )


if __name__ == "__main__":
    which = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    {"queue": queue_matrix, "dispatch": dispatch_matrix, "pickup": pickup, "e2e": e2e}[which](rounds)
