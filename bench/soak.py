"""The chaos soak (benchmarks/soak.py): OmniPost's real processes on a private PostgreSQL server,
mixed load, a fault every N seconds, then the ledger.

    .venv/bin/python bench/soak.py --minutes 5 --rate 60 --fault-every 20 --seed 1 [--pooled] [--standby] \
        [--kinds pg_restart,kill9,…] [--quick] [--json FILE] [--png FILE] [--markdown FILE]

`--pooled`: the processes through PgBouncer, and `pgbouncer_restart` among the faults; `--standby`: a
streaming standby, and `failover` among them (a new standby is rebuilt after each, so it recurs).
`--kinds` naming a kind whose mode is not given exits 2 with one line. Needs no DATABASE_URL (the
server is its own). Progress on stderr, the Markdown report on stdout
(and in --markdown); exit 1 when the ledger fails (lost notifications, duplicates outside a
kill's in-flight set, missing events or receipts, a process not alive at the end).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.soak import FAULT_KINDS, SoakConfig, markdown, png, run, unavailable  # noqa: E402


def kinds(value: str) -> tuple[str, ...]:
    wanted = tuple(k.strip() for k in value.split(",") if k.strip())
    unknown = sorted(set(wanted) - set(FAULT_KINDS))
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
    return wanted


def positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError("must be a positive number")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/soak.py", description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=positive)
    length.add_argument("--seconds", type=positive)
    parser.add_argument("--rate", type=positive, default=50.0, help="notifications a second (default 50)")
    parser.add_argument("--fault-every", type=positive, default=20.0, help="seconds between faults (default 20)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", type=kinds, help=f"comma-separated of {', '.join(FAULT_KINDS)} "
                        "(default: every kind the modes allow)")
    parser.add_argument("--pooled", action="store_true", help="through PgBouncer; pgbouncer_restart among the faults")
    parser.add_argument("--standby", action="store_true", help="a streaming standby; failover among the faults")
    parser.add_argument("--provider-delay-ms", type=float, default=100.0,
                        help="the provider's time to answer, ms (default 100)")
    parser.add_argument("--quick", action="store_true", help="short faults and a 4 s lease (the test's soak)")
    parser.add_argument("--workdir", type=Path, help="keep the processes' logs here")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    lacking = args.kinds and unavailable(args.kinds, pooled=args.pooled, standby=args.standby)
    if lacking:
        print(f"bench/soak.py: {lacking}", file=sys.stderr)
        return 2
    seconds = args.seconds or (args.minutes or 5.0) * 60

    def progress(message: str) -> None:
        print(f"soak {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)

    config = SoakConfig(seconds=seconds, rate=args.rate, fault_every=args.fault_every, seed=args.seed,
                        kinds=args.kinds, quick=args.quick, pooled=args.pooled, standby=args.standby,
                        workdir=args.workdir, progress=progress,
                        provider_delay_ms=args.provider_delay_ms)  # fmt: skip
    report = run(config)
    text = markdown(report)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=1, default=str) + "\n")
    if args.png:
        png(report, args.png)
    if not report.ok:
        print(f"soak: FAIL: {'; '.join(report.failures)}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
