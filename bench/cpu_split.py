"""Run a command and report the CPU time every kind of process on the machine spent meanwhile.

    .venv/bin/python bench/cpu_split.py [--per N] -- .venv/bin/python manage.py omnipost_bench -n 60000 …

Throughput on this shared 2-core machine drifts by up to 30 % between runs; CPU time per delivery
does not, so a change to the hot path is judged by it. Every process is sampled from /proc every
20 ms and its last reading kept (a process that exits between two samples loses at most 20 ms).
Groups: PostgreSQL backends, dispatchers, the bench receiver, the bench command, everything else.
With `--per N`, each group's time is also given in microseconds per item.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
GROUPS = (
    ("postgres", lambda cmd: cmd.startswith("postgres")),
    ("dispatchers", lambda cmd: "run_dispatcher" in cmd or "benchmarks.dispatcher" in cmd),
    ("receiver", lambda cmd: "bench.receiver" in cmd or "receiver" in cmd.split(" ")[-1:]),
    ("bench command", lambda cmd: "omnipost_bench" in cmd),
    ("node (anchors)", lambda cmd: cmd.startswith("node")),
)


def snapshot() -> dict[int, tuple[str, float]]:
    seen = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
        seen[int(entry.name)] = (cmd or stat[stat.index("(") + 1 : stat.rindex(")")], seconds)
    return seen


def group_of(cmd: str) -> str:
    return next((name for name, match in GROUPS if match(cmd)), "other")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per", type=int, help="items processed, for µs per item")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    before = snapshot()
    last = dict(before)
    started = time.monotonic()
    proc = subprocess.Popen(command)  # noqa: S603 - the operator's own command line
    def take() -> None:
        for pid, (cmd, seconds) in snapshot().items():
            if pid in last and last[pid][0] != cmd and not (pid in before and before[pid][0] == cmd):
                cmd = last[pid][0]  # an exiting process's cmdline reads empty: keep the name it had
            last[pid] = (cmd, seconds)

    while proc.poll() is None:
        take()
        time.sleep(0.02)
    take()
    wall = time.monotonic() - started
    totals: dict[str, float] = {}
    others: dict[str, float] = {}
    for pid, (cmd, seconds) in last.items():
        spent = seconds - (before[pid][1] if pid in before and before[pid][0] == cmd else 0.0)
        if pid != os.getpid() and spent > 0:
            totals[group_of(cmd)] = totals.get(group_of(cmd), 0.0) + spent
            if group_of(cmd) == "other":
                others[cmd[:60]] = others.get(cmd[:60], 0.0) + spent
    print(f"\nCPU seconds over {wall:.1f} s of wall time (2 cores = {2 * wall:.1f} CPU s available):")
    for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        per = f"   {seconds / args.per * 1e6:8.1f} µs per item" if args.per else ""
        print(f"  {name:<16} {seconds:8.2f} s{per}")
    busiest = sorted(others.items(), key=lambda kv: -kv[1])[:3]
    if busiest:
        print("  other, busiest: " + "; ".join(f"{cmd} {seconds:.2f} s" for cmd, seconds in busiest))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
