"""Through PgBouncer against direct, what turning prepared statements off costs, and dispatchers on 1, 2, 3 "hosts".

    DATABASE_URL=postgres://… .venv/bin/python bench/pooler_bench.py [-n 60000] [--rounds 3]
        [--delay-ms 0] [--hosts 1,2,3] [--per-host 1] [--only statements|versus|hosts] [--json FILE]

DATABASE_URL is the direct, migrated bench database. Every run is `run_e2e`'s drain (benchmarks.runner:
N notifications created first, dispatchers started and let go together, stopped once the queue is
empty, the rate counted at the receiver as unique webhook ids / (last − first arrival)), with the
dispatchers of bench/versus.py (2 processes, 2,000 in flight, claims of up to 1,000, the receiver
checking one signature in 20). Any duplicate or lost delivery fails the run (exit 1, one line).

- **versus** (this machine's loopback), three modes in rotating order each round:
  `direct` (prepared statements, LISTEN); `unprepared` (direct, but `OMNIPOST_DATABASE_POOLER=pgbouncer`:
  nothing prepared, polling — the cost of the switch alone); `pgbouncer` (the same through a private
  PgBouncer 1.18 in transaction mode, pool 20: the cost of the switch and the extra hop).
- **hosts** (root: network namespaces, tests/support/netns.py): the same drain with one dispatcher
  process per "host" (`--per-host`) on 1, 2, 3 hosts, each through PgBouncer on its veth gateway,
  the receiver on the first gateway. On a machine with fewer cores than processes the curve shows
  where it bends, not how far many real machines would go.

- **statements**: the hot path's statements alone, prepared against unprepared, in this process
  on the direct connection (one API create; a claim + record of 100), milliseconds each.

Progress goes to stderr, markdown tables to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")
os.environ.setdefault("DEBUG", "true")
os.environ.setdefault("OMNIPOST_LOG_LEVEL", "WARNING")

WORKERS = 2  # as bench/versus.py
CONCURRENCY = 2000
BATCH = 1000
VERIFY_EVERY = 20
POOL_SIZE = 20


class Failure(Exception):
    """A run that cannot be reported; its message is the one line printed."""


def say(message: str) -> None:
    print(f"pooler_bench: {message}", file=sys.stderr, flush=True)


def direct_url() -> str:
    from django.conf import settings

    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}:{db.get('PASSWORD') or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def db_name() -> str:
    from django.conf import settings

    return settings.DATABASES["default"]["NAME"]


def drain(
    count: int, *, env: dict[str, str], processes: int, delay_ms: float, receiver_host: str = "127.0.0.1",
    popen=None,  # noqa: ANN001 - (i, argv, **kwargs) -> Popen: where dispatcher i runs (default: here)
) -> dict[str, Any]:  # fmt: skip
    """One drain of `count` notifications by `processes` dispatchers started with `env`."""
    from benchmarks.receiver import ReceiverProcess, first_to_last_rate
    from benchmarks.runner import (
        SIGNING_SECRET,
        analyze_hot_tables,
        bench_tenant_and_provider,
        dispatcher_env,
        enqueue,
        release_together,
        stop_when_drained,
    )  # fmt: skip
    from notifications.models import Notification

    receiver = ReceiverProcess(delay_ms=delay_ms, verify_every=VERIFY_EVERY, secret=SIGNING_SECRET, host=receiver_host)
    try:
        tenant, provider = bench_tenant_and_provider(receiver.url)
        enqueue(tenant, provider, count)
        analyze_hot_tables()
        with tempfile.TemporaryDirectory(prefix="pooler-bench-") as tmp:
            go_file = Path(tmp) / "go"
            procs = []
            for i in range(processes):
                argv = [sys.executable, "-m", "benchmarks.dispatcher", "--no-jitter", "--concurrency", str(CONCURRENCY),
                        "--batch-size", str(BATCH), "--stats-file", str(Path(tmp) / f"dispatcher{i}.json"),
                        "--go-file", str(go_file)]  # fmt: skip
                kwargs = {"cwd": ROOT, "env": {**dispatcher_env(), **env}}
                procs.append(popen(i, argv, **kwargs) if popen else subprocess.Popen(argv, **kwargs))  # noqa: S603
            release_together(procs, go_file)
            stop_when_drained(procs, tenant)
            if any(proc.returncode for proc in procs):
                raise Failure(f"a dispatcher exited {[proc.returncode for proc in procs]}")
    finally:
        final, arrivals = receiver.stop()
    delivered = Notification.objects.filter(tenant=tenant, status="delivered").count()
    lost = count - len(arrivals) + max(0, count - delivered)
    return {"delivered_per_second": first_to_last_rate(arrivals.values()), "duplicates": final["duplicates"],
            "lost": lost}  # fmt: skip


def checked(name: str, figures: dict[str, Any], count: int) -> float:
    if figures["duplicates"] or figures["lost"]:
        raise Failure(f"{name}: {figures['duplicates']} duplicate(s), {figures['lost']} lost of {count:,}")
    return figures["delivered_per_second"]


def settle() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")  # the run before's dirty pages are written now, not during the next


def versus(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.pgbouncer import PrivatePgBouncer

    modes = ["direct", "unprepared", "pgbouncer"]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    with PrivatePgBouncer(direct_url(), pool_size=POOL_SIZE) as bouncer:
        dbname = db_name()
        envs = {
            "direct": {},
            "unprepared": {"OMNIPOST_DATABASE_POOLER": "pgbouncer"},
            "pgbouncer": {"OMNIPOST_DATABASE_POOLER": "pgbouncer", "DATABASE_URL": bouncer.url(dbname)},
        }
        for round_no in range(1, args.rounds + 1):
            shift = (round_no - 1) % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                settle()
                rate = checked(mode, drain(args.notifications, env=envs[mode], processes=WORKERS,
                                           delay_ms=args.delay_ms), args.notifications)  # fmt: skip
                rates[mode].append(rate)
                say(f"versus round {round_no}/{args.rounds}: {mode} {rate:,.0f} /s (load {os.getloadavg()[0]:.2f})")
    median = {m: statistics.median(r) for m, r in rates.items()}
    lines = [
        f"### Through PgBouncer against direct: {args.notifications:,} notifications, {WORKERS} dispatchers, "
        f"{args.delay_ms:g} ms receiver, {args.rounds} rounds",
        "", "| mode | rounds (deliveries/s) | median | vs direct |", "|---|---|---|---|",
    ]  # fmt: skip
    for mode in modes:
        lines.append(f"| {mode} | {', '.join(f'{r:,.0f}' for r in rates[mode])} | {median[mode]:,.0f} | "
                     f"{median[mode] / median['direct'] - 1:+.1%} |")  # fmt: skip
    print("\n".join(lines) + "\n", flush=True)
    return {"rates": rates, "median": median}


def hosts(args: argparse.Namespace) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise Failure("the hosts part needs root (ip netns); run with --only versus otherwise")
    from tests.support.netns import Hosts
    from tests.support.pgbouncer import PrivatePgBouncer

    counts = [int(n) for n in args.hosts.split(",")]
    rates: dict[int, list[float]] = {n: [] for n in counts}
    dbname = db_name()
    with Hosts(max(counts)) as machines, PrivatePgBouncer(
        direct_url(), listen=machines.gateways(), pool_size=POOL_SIZE
    ) as bouncer:

        def on_host(n: int):  # noqa: ANN202
            def popen(i: int, argv: list[str], **kwargs: Any) -> subprocess.Popen:
                host = i % n
                kwargs["env"] = {**kwargs["env"], "DATABASE_URL": bouncer.url(dbname, host=machines.gateway(host))}
                return machines.popen(host, argv, hostname=f"omnipost-bench-{host + 1}", **kwargs)

            return popen

        for round_no in range(1, args.rounds + 1):
            for n in counts if round_no % 2 else list(reversed(counts)):
                settle()
                figures = drain(args.notifications, env={"OMNIPOST_DATABASE_POOLER": "pgbouncer"},
                                processes=n * args.per_host, delay_ms=args.delay_ms,
                                receiver_host=machines.gateway(0), popen=on_host(n))  # fmt: skip
                rate = checked(f"{n} host(s)", figures, args.notifications)
                rates[n].append(rate)
                say(f"hosts round {round_no}/{args.rounds}: {n} host(s) {rate:,.0f} /s (load {os.getloadavg()[0]:.2f})")
    median = {n: statistics.median(r) for n, r in rates.items()}
    lines = [
        f"### Dispatchers on 1…{max(counts)} hosts through PgBouncer: {args.notifications:,} notifications, "
        f"{args.per_host} process(es) per host, {os.cpu_count()} cores",
        "", "| hosts | rounds (deliveries/s) | median | per host |", "|---|---|---|---|",
    ]  # fmt: skip
    for n in counts:
        lines.append(f"| {n} | {', '.join(f'{r:,.0f}' for r in rates[n])} | {median[n]:,.0f} | {median[n] / n:,.0f} |")
    print("\n".join(lines) + "\n", flush=True)
    return {"rates": rates, "median": median}


def statements(args: argparse.Namespace) -> dict[str, Any]:
    """The hot path's statements alone, in this process on the direct connection, prepared (the
    default) against unprepared (OMNIPOST_DATABASE_POOLER=pgbouncer): one API create (one statement)
    and a dispatcher's claim + record of 100 items (two statements), milliseconds each."""
    from django.db import connection
    from django.test.utils import override_settings
    from django.utils import timezone

    from benchmarks.runner import bench_tenant_and_provider
    from dispatch.delivery import Attempt, Outcome, claim_and_start, record_outcomes
    from notifications.services import NotificationSpec, create_notifications

    creates, batch = max(200, args.notifications // 10), 100
    figures: dict[str, dict[str, list[float]]] = {
        m: {"create_ms": [], "claim_record_ms": []} for m in ("none", "pgbouncer")
    }
    tenant, provider = bench_tenant_and_provider("http://127.0.0.1:9/hook")
    spec = NotificationSpec(channel="webhook", recipient="https://hooks.example.test/u/1", provider=provider,
                            subject="Order shipped", body="Your order has shipped.")  # fmt: skip
    for round_no in range(1, args.rounds + 1):
        for pooler in ("none", "pgbouncer") if round_no % 2 else ("pgbouncer", "none"):
            with override_settings(OMNIPOST_DATABASE_POOLER=pooler):
                connection.close()  # a new session: nothing prepared on it yet
                for _ in range(20):  # warm: connection, caches, (prepared) statements
                    create_notifications(tenant, [spec], actor="system:pooler_bench")
                started = time.perf_counter()
                for _ in range(creates):
                    create_notifications(tenant, [spec], actor="system:pooler_bench")
                figures[pooler]["create_ms"].append((time.perf_counter() - started) * 1000 / creates)
                rounds, started = 0, time.perf_counter()
                while True:
                    claimed, _ = claim_and_start(batch, lease_seconds=60)
                    if not claimed:
                        break
                    now = timezone.now()
                    record_outcomes([Outcome(p.lease, "delivered", Attempt(p.attempt_number, now, now, "delivered"))
                                     for p in claimed])  # fmt: skip
                    rounds += 1
                figures[pooler]["claim_record_ms"].append((time.perf_counter() - started) * 1000 / max(1, rounds))
            say(f"statements round {round_no}/{args.rounds}, pooler {pooler}: create "
                f"{figures[pooler]['create_ms'][-1]:.3f} ms, claim+record of {batch} "
                f"{figures[pooler]['claim_record_ms'][-1]:.2f} ms")  # fmt: skip
    lines = [f"### Prepared statements on and off: {creates:,} creates and claims of {batch} per round, "
             f"{args.rounds} rounds (medians)", "", "| statement | prepared | unprepared | cost |", "|---|---|---|---|"]
    for key, label in (("create_ms", "API create (ms)"), ("claim_record_ms", f"claim + record of {batch} (ms)")):
        on, off = statistics.median(figures["none"][key]), statistics.median(figures["pgbouncer"][key])
        lines.append(f"| {label} | {on:.3f} | {off:.3f} | {off / on - 1:+.1%} |")
    print("\n".join(lines) + "\n", flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/pooler_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--notifications", "-n", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="receiver delay (default 0)")
    parser.add_argument("--hosts", default="1,2,3", help="host counts of the hosts part (default 1,2,3)")
    parser.add_argument("--per-host", type=int, default=1, help="dispatcher processes per host (default 1)")
    parser.add_argument("--only", choices=["versus", "hosts", "statements"])
    parser.add_argument("--json", dest="json_path", help="also write every figure to this file")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print("pooler_bench: DATABASE_URL must be the direct postgres:// bench database", file=sys.stderr)
        return 1
    import django

    django.setup()
    report: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        if args.only in (None, "statements"):
            report["statements"] = statements(args)
        if args.only in (None, "versus"):
            report["versus"] = versus(args)
        if args.only in (None, "hosts"):
            report["hosts"] = hosts(args)
    except (Failure, RuntimeError) as exc:
        print(f"pooler_bench: {exc}", file=sys.stderr)
        return 1
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
