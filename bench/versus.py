"""OmniPost against graphile-worker, measured in alternation in one run against the same receiver.

    DATABASE_URL=postgres://… .venv/bin/python bench/versus.py [--rounds 3] [-n N] [--delay-ms 0 --delay-ms 100]
        [--json FILE]

Each round runs both systems once per receiver delay, alternating which goes first (round 1
OmniPost first, round 2 graphile-worker first, …), so the machine's drift over the run falls on
both alike:

- OmniPost: `manage.py omnipost_bench -n N -p 2 -c 2000 -b 1000 --receiver-delay-ms D --verify-every 20`
  (2 dispatcher processes, started and then let go together, as the anchor's are). Up to 2,000
  items claimed per process, at most 256 of them on the wire (the HTTP pool's limit per host), the
  rest waiting for a connection, as the anchor's local queue of 500 waits for its 200 slots: claims
  and records of ≈ 500–650 items instead of ≈ 250 were 7–15 % faster at 0 ms (the same at 100 ms,
  where the connections bound the rate). The receiver
  checks every 20th signature, not every one: it shares the two cores with what it measures, and
  checking all of them cost it ≈ 5 µs a request more than it spends on the anchor's unsigned
  requests. A wrong signature is still answered 401 and fails the run.
- graphile-worker (bench/anchors/graphile_worker, pinned in its package-lock.json): a fresh
  `graphile_worker` schema in a separate database (DATABASE_URL with the name replaced by
  `omnipost_anchor`, created if missing); the same receiver (`benchmarks.receiver`, without a
  signing secret: the anchor does not sign); N jobs enqueued first (`enqueue.js`), then 2 worker
  processes (`worker.js`, concurrency 200 each, batched fetch and completion) started, warmed up
  (their HTTP client, against a server of their own) and let go at the same moment, and drained.

Both rates are counted the same way, at the receiver, as `run_e2e` does: unique webhook ids /
(last arrival − first arrival). Any duplicate or lost delivery makes the run fail (exit 1, one
line on stderr); so do a missing `node` and a timeout. Progress goes to stderr, the markdown
tables to stdout. `npm ci` runs in the anchor's folder when its node_modules is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.receiver import ReceiverProcess, first_to_last_rate, steady_rate  # noqa: E402 - Django-free; the receiver both systems use

ANCHOR = ROOT / "bench" / "anchors" / "graphile_worker"
WORKERS = 2  # both systems: two processes
VERIFY_EVERY = 20  # the receiver checks one OmniPost signature in 20 (see the docstring)
OMNIPOST_CONCURRENCY = 2000  # items claimed per dispatcher process (see the docstring)
OMNIPOST_BATCH = 1000  # largest claim
DEFAULT_COUNT = {0.0: 60_000}  # per receiver delay; any other delay: DEFAULT_COUNT_SLOW
DEFAULT_COUNT_SLOW = 30_000
ANCHOR_DATABASE = os.environ.get("OMNIPOST_ANCHOR_DATABASE", "omnipost_anchor")  # one per concurrent run


class Failure(Exception):
    """A run that cannot be reported; its message is the one line printed."""


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def say(message: str) -> None:
    print(f"versus: {message}", file=sys.stderr, flush=True)


# --- OmniPost -----------------------------------------------------------------------------------------
EVENT_ENDPOINTS = False  # --event-endpoints: the bench tenant has an event endpoint for every type
FAILOVER = False  # --failover: two providers in failover order, notifications naming neither


# A measurement from outside (bench/per_delivery.py): called with "delivering" and the workers' pids
# once the jobs are enqueued and the workers ready, just before they are let go, and with "drained"
# once every job is done (OmniPost: queue empty, dispatchers still running; graphile-worker: its
# processes have exited, as they do when the queue is empty).
Gate = Callable[[str, list[int]], None]


def follow_phase_gate(proc: subprocess.Popen, gate: Gate, deadline: float) -> None:
    """Speak `omnipost_bench --phase-gate`'s side: on each {"phase": …} line, call `gate`, then
    answer with a line. Its stdout is read by a thread, so a deadline holds however it writes."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.time()))
        except queue.Empty:
            raise subprocess.TimeoutExpired(proc.args, 0) from None
        if line is None:
            return  # it exited: its exit status tells why
        if not line.startswith('{"phase"'):
            continue
        message = json.loads(line)
        gate(message["phase"], message["pids"])
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        if message["phase"] == "drained":
            proc.stdin.close()  # type: ignore[union-attr]
            return


def run_omnipost(
    count: int, delay_ms: float, timeout: float, *, database_url: str | None = None, gate: Gate | None = None
) -> dict[str, Any]:
    """`database_url`: another database than DATABASE_URL's (migrated)."""
    env = {**os.environ, "DEBUG": os.environ.get("DEBUG", "true"), "OMNIPOST_LOG_LEVEL": "WARNING"}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    with tempfile.TemporaryDirectory(prefix="versus-") as tmp, open(Path(tmp) / "stderr", "w+") as errors:
        out = Path(tmp) / "omnipost.json"
        args = ["-n", str(count), "-p", str(WORKERS), "-c", str(OMNIPOST_CONCURRENCY), "-b", str(OMNIPOST_BATCH),
                "--receiver-delay-ms", f"{delay_ms:g}", "--verify-every", str(VERIFY_EVERY)]
        if EVENT_ENDPOINTS:
            args.append("--event-endpoints")
        if FAILOVER:
            args.append("--failover")
        if gate is not None:
            args.append("--phase-gate")
        pipe = subprocess.PIPE if gate is not None else subprocess.DEVNULL
        # its own process group: on a timeout its receiver and dispatchers are stopped with it
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "omnipost_bench", *args, "--json", str(out)],
            cwd=ROOT, env=env, stdin=pipe, stdout=pipe, stderr=errors, text=True, start_new_session=True,
        )  # fmt: skip
        deadline = time.time() + timeout
        try:
            if gate is not None:
                follow_phase_gate(proc, gate, deadline)
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
            raise Failure(
                f"OmniPost bench ({count:,} at {delay_ms:g} ms) did not finish within {timeout:g} s"
            ) from None
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            raise
        if proc.returncode != 0 or not out.exists():
            errors.seek(0)
            raise Failure(f"OmniPost bench failed (exit {proc.returncode}): {last_line(errors.read())}")
        (result,) = json.loads(out.read_text())
    if not result.get("delivered_per_second"):
        raise Failure("OmniPost bench reported no delivery rate")
    return {
        "delivered_per_second": result["delivered_per_second"],
        "steady_per_second": result.get("steady_per_second"),
        "delivered": result["delivered"],
        "duplicates": result["duplicates"],
        "lost": result["lost"],
        "wall_seconds": result["wall_seconds"],
        "enqueue_per_second": result["enqueue_per_second"],
        "events_per_second": result.get("events_per_second"),
    }


# --- graphile-worker ----------------------------------------------------------------------------------
def anchor_database_url(url: str, name: str = ANCHOR_DATABASE) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise Failure(f"DATABASE_URL must be a postgres:// URL for the anchor, not {parts.scheme or url!r}")
    if parts.path.lstrip("/") == name:
        raise Failure(f"DATABASE_URL already names {name!r}: the anchor needs a database of its own")
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def check_node() -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        raise Failure("node is not installed (graphile-worker needs Node.js 20 or later)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    try:
        major = int(version.lstrip("v").split(".")[0])
    except ValueError:
        raise Failure(f"cannot read the node version ({version!r})") from None
    if major < 20:
        raise Failure(f"node {version} is too old: the anchor needs Node.js 20 or later")
    if not (ANCHOR / "node_modules" / "graphile-worker").is_dir():
        if npm is None:
            raise Failure("npm is not installed (needed once for `npm ci` in bench/anchors/graphile_worker)")
        say("npm ci in bench/anchors/graphile_worker")
        proc = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=ANCHOR, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise Failure(f"npm ci failed in bench/anchors/graphile_worker: {last_line(proc.stderr)}")


def wait_until_ready(workers: list[subprocess.Popen], logs: list[Any], deadline: float) -> None:
    """Each worker warms its HTTP client up, then prints {"event": "ready"} and waits for "go"."""
    waiting = {worker.stdout: (worker, log) for worker, log in zip(workers, logs, strict=True)}
    with selectors.DefaultSelector() as selector:
        for stream in waiting:
            selector.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        while waiting:
            remaining = deadline - time.time()
            if remaining <= 0:
                raise Failure("graphile-worker processes did not get ready within 60 s")
            for key, _ in selector.select(timeout=remaining):
                worker, log = waiting.pop(key.fileobj)  # type: ignore[call-overload]
                selector.unregister(key.fileobj)
                line = key.fileobj.readline()  # type: ignore[union-attr]
                if '"ready"' not in line:
                    worker.wait(timeout=10)
                    log.seek(0)
                    raise Failure(f"a graphile-worker process failed to start: {last_line(log.read())}")


def reap(worker: subprocess.Popen, deadline: float) -> float:
    """Wait for a worker to exit; returns the CPU seconds (user + system, every thread) it spent in
    its whole life, from the kernel's accounting at its exit (wait4), which /proc no longer has."""
    while True:
        pid, status, usage = os.wait4(worker.pid, os.WNOHANG)
        if pid:
            worker.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.time() > deadline:
            raise subprocess.TimeoutExpired(worker.args, 0)
        time.sleep(0.005)


def run_graphile(
    count: int, delay_ms: float, database_url: str, timeout: float, *, gate: Gate | None = None
) -> dict[str, Any]:
    env = {**os.environ, "DATABASE_URL": database_url}
    try:
        receiver = ReceiverProcess(delay_ms=delay_ms)  # unsigned: graphile-worker's jobs sign nothing
    except RuntimeError as exc:
        raise Failure(str(exc)) from None
    workers: list[subprocess.Popen] = []
    logs: list[Any] = []
    try:
        try:
            proc = subprocess.run(
                ["node", "enqueue.js", "--count", str(count)],
                cwd=ANCHOR, env=env, capture_output=True, text=True, timeout=timeout, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise Failure(f"graphile-worker enqueue of {count:,} jobs did not finish within {timeout:g} s") from None
        if proc.returncode != 0:
            raise Failure(f"graphile-worker enqueue failed: {last_line(proc.stderr)}")
        enqueued = json.loads(last_line(proc.stdout))
        for _ in range(WORKERS):
            log = tempfile.TemporaryFile(mode="w+")  # closed in the finally below
            logs.append(log)
            workers.append(
                subprocess.Popen(
                    ["node", "worker.js", "--url", receiver.url, "--wait-for-go"],
                    cwd=ANCHOR,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )  # fmt: skip
            )
        wait_until_ready(workers, logs, time.time() + 60)
        if gate is not None:
            gate("delivering", [worker.pid for worker in workers])
        started = time.time()
        for worker in workers:  # both start taking jobs now
            worker.stdin.write("go\n")  # type: ignore[union-attr]
            worker.stdin.close()  # type: ignore[union-attr]
        deadline = started + timeout
        cpu_seconds = 0.0
        for worker in workers:
            try:
                cpu_seconds += reap(worker, deadline)
            except subprocess.TimeoutExpired:
                raise Failure(
                    f"graphile-worker did not drain {count:,} jobs at {delay_ms:g} ms within {timeout:g} s"
                ) from None
        wall = time.time() - started
        if gate is not None:
            gate("drained", [worker.pid for worker in workers])
        for worker, log in zip(workers, logs, strict=True):
            if worker.returncode != 0:
                log.seek(0)
                raise Failure(f"a graphile-worker process failed (exit {worker.returncode}): {last_line(log.read())}")
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            if worker.stdout is not None:
                worker.stdout.close()
        for log in logs:
            log.close()
        final, arrivals = receiver.stop()
    result: dict[str, Any] = {
        "delivered_per_second": first_to_last_rate(arrivals.values()),
        "steady_per_second": steady_rate(arrivals.values()),
        "delivered": len(arrivals),
        "duplicates": final["duplicates"],
        "lost": max(0, count - len(arrivals)),
        "wall_seconds": wall,
        "enqueue_per_second": enqueued["per_second"],
        "worker_cpu_seconds": cpu_seconds,  # both processes, start-up and warm-up included
    }
    if not result["delivered_per_second"]:
        raise Failure("graphile-worker delivered nothing measurable")
    return result


# --- report -------------------------------------------------------------------------------------------
def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def table(delay_ms: float, count: int, rounds: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    omni = [r["omnipost"]["delivered_per_second"] for r in rounds]
    anchor = [r["graphile"]["delivered_per_second"] for r in rounds]
    summary = {
        "median_omnipost": statistics.median(omni),
        "median_graphile": statistics.median(anchor),
        "median_of_ratios": statistics.median(r["ratio"] for r in rounds),
    }
    summary["ratio_of_medians"] = ratio(summary["median_omnipost"], summary["median_graphile"])
    lines = [
        f"### Receiver {delay_ms:g} ms, {count:,} deliveries per run, {WORKERS} processes each",
        "",
        "| round | first | OmniPost /s | graphile-worker /s | OmniPost / graphile |",
        "|---|---|---|---|---|",
    ]
    for r in rounds:
        lines.append(
            f"| {r['round']} | {r['first']} | {r['omnipost']['delivered_per_second']:,.0f} | "
            f"{r['graphile']['delivered_per_second']:,.0f} | {r['ratio']:.2f} |"
        )
    lines.append(
        f"| **median** | | **{summary['median_omnipost']:,.0f}** | **{summary['median_graphile']:,.0f}** | "
        f"**{summary['ratio_of_medians']:.2f}** (median of the rounds' ratios {summary['median_of_ratios']:.2f}) |"
    )
    steady = [ratio(r["omnipost"].get("steady_per_second"), r["graphile"].get("steady_per_second")) for r in rounds]
    if all(steady):
        summary["median_of_steady_ratios"] = statistics.median(steady)
        lines += [
            "",
            "Over the middle 80 % of each run's arrivals (ramp-up and tail left out), OmniPost / graphile: "
            + " / ".join(f"{x:.2f}" for x in steady)
            + f", median **{summary['median_of_steady_ratios']:.2f}**.",
        ]
    dup = {k: sum(r[k]["duplicates"] for r in rounds) for k in ("omnipost", "graphile")}
    lost = {k: sum(r[k]["lost"] for r in rounds) for k in ("omnipost", "graphile")}
    lines += [
        "",
        f"Duplicates / lost over all rounds: OmniPost {dup['omnipost']} / {lost['omnipost']}, "
        f"graphile-worker {dup['graphile']} / {lost['graphile']}.",
        "",
    ]
    return "\n".join(lines), summary


def settle(database_url: str) -> None:
    """CHECKPOINT before every run: the dirty pages of the run before are written now, not during
    the next one (which favoured whichever system ran second in a round by ≈ 7 %)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def check_database(database_url: str) -> None:
    """Failure, in one line, unless DATABASE_URL reaches a database OmniPost's migrations have built."""
    import psycopg

    try:
        with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
            migrated = conn.execute("SELECT to_regclass('queue_state') IS NOT NULL").fetchone()[0]
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
        raise Failure(f"cannot reach DATABASE_URL's database ({reason}); create it and run manage.py migrate") from None
    if not migrated:
        raise Failure("DATABASE_URL's database has no OmniPost tables: run manage.py migrate against it first")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    database_url = os.environ.get("DATABASE_URL", "")
    if not database_url:
        raise Failure("DATABASE_URL is not set (the OmniPost bench database, already migrated)")
    check_database(database_url)
    anchor_url = anchor_database_url(database_url)
    if args.only != "omnipost":
        check_node()
    report: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores, {os.uname().machine}, Python {sys.version.split()[0]}",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rounds": args.rounds,
        "delays": [],
    }
    for delay_ms in args.delay_ms:
        count = args.notifications or DEFAULT_COUNT.get(delay_ms, DEFAULT_COUNT_SLOW)
        load = os.getloadavg()[0]
        rounds = []
        for round_no in range(1, args.rounds + 1):
            if args.only:
                order: tuple[str, ...] = (args.only,)
            else:
                order = ("omnipost", "graphile") if round_no % 2 else ("graphile", "omnipost")
            entry: dict[str, Any] = {"round": round_no, "first": "OmniPost" if order[0] == "omnipost" else "graphile"}
            for system in order:
                settle(database_url)
                if system == "omnipost":
                    figures = run_omnipost(count, delay_ms, args.timeout)
                else:
                    figures = run_graphile(count, delay_ms, anchor_url, args.timeout)
                name = "OmniPost" if system == "omnipost" else "graphile-worker"
                rate = figures["delivered_per_second"]
                say(
                    f"{delay_ms:g} ms, round {round_no}/{args.rounds}: {name} {rate:,.0f} /s ({figures['duplicates']} "
                    f"duplicates, {figures['lost']} lost, load {os.getloadavg()[0]:.2f})"
                )
                if figures["duplicates"] or figures["lost"]:
                    raise Failure(
                        f"{name} at {delay_ms:g} ms, round {round_no}: {figures['duplicates']} duplicate(s) and "
                        f"{figures['lost']} lost of {count:,}: the run is invalid"
                    )
                entry[system] = figures
                if args.only:
                    print(f"{name}, {delay_ms:g} ms, round {round_no}: {rate:,.0f} /s", flush=True)
            rounds.append(entry)
            if not args.only:
                entry["ratio"] = ratio(entry["omnipost"]["delivered_per_second"],
                                       entry["graphile"]["delivered_per_second"])  # fmt: skip
        delay_report = {"delay_ms": delay_ms, "count": count, "load_at_start": load, "rounds": rounds}
        if not args.only:  # one system alone has no ratio and no comparison table
            text, summary = table(delay_ms, count, rounds)
            print(text, flush=True)
            delay_report.update(summary)
        report["delays"].append(delay_report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/versus.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per receiver delay (default 3)")
    parser.add_argument(
        "-n", "--notifications", type=int,
        help=f"deliveries per run (default {DEFAULT_COUNT[0.0]:,} at 0 ms, {DEFAULT_COUNT_SLOW:,} at other delays)",
    )  # fmt: skip
    parser.add_argument(
        "--delay-ms", type=float, action="append", help="receiver delay; repeat for several (default 0)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run (default 600)")
    parser.add_argument("--json", dest="json_path", help="also write every figure to this file")
    parser.add_argument(
        "--only", choices=("omnipost", "graphile"), help="run one system alone (e.g. under bench/cpu_window.py)"
    )
    parser.add_argument(
        "--event-endpoints", action="store_true",
        help="OmniPost's tenant also has an event endpoint subscribed to every type (bench/events_bench.py "
        "compares with and without)",
    )  # fmt: skip
    parser.add_argument(
        "--failover", action="store_true",
        help="OmniPost's notifications go through two providers in failover order (breakers and all)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    global EVENT_ENDPOINTS, FAILOVER  # noqa: PLW0603 - flags for run_omnipost, set once here
    EVENT_ENDPOINTS, FAILOVER = args.event_endpoints, args.failover
    args.delay_ms = args.delay_ms or [0.0]
    if args.rounds < 1 or (args.notifications is not None and args.notifications < 1):
        parser.error("--rounds and -n must be at least 1")
    try:
        report = measure(args)
    except Failure as exc:
        print(f"versus: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("versus: interrupted", file=sys.stderr)
        return 130
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
