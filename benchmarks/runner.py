"""The end-to-end benchmark behind `manage.py omnipost_bench`.

Everything runs on the configured database and this machine's loopback: a bench tenant with a
webhook provider pointing at a built-in receiver subprocess, notifications created through the
same service the batch API uses, and real dispatcher processes (`benchmarks.dispatcher`: the
ordinary Dispatcher behind a start gate, its figures read from outside). Three modes:

- e2e: enqueue N, then P dispatchers drain them to the receiver; delivery rate, latency, SQL
  statements per delivery, duplicates and losses (both must be zero).
- pickup: idle dispatchers; notifications created one at a time at a steady rate; latency from
  the create call returning to arrival at the receiver.
- queue-only: no-op items, P processes claim+ack in batches; the queue alone.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from benchmarks.receiver import ReceiverProcess, first_to_last_rate, steady_rate
from benchmarks.seeding import notifications_insert
from core import partitions
from core.db_url import database_url
from queueing import queue

ROOT = Path(settings.BASE_DIR)
BENCH_TENANT = "omnipost-bench"
SIGNING_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105 - a throwaway for the loopback bench
EVENT_SECRET = "whsec_RXZlbnRzQmVuY2hTZWNyZXRGb3JMb29wYmFjaw=="  # noqa: S105 - the bench's event endpoint's


@dataclass
class BenchResult:
    mode: str
    notifications: int
    processes: int
    concurrency: int
    batch_size: int
    receiver_delay_ms: float
    enqueue_per_second: float | None = None
    delivered_per_second: float | None = None
    steady_per_second: float | None = None  # over the middle 80 % of arrivals (see steady_rate)
    wall_seconds: float | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)
    # pickup: the create call itself (create_notifications, statement and doorbell), and from its
    # start to arrival ("created → delivered" as the client sees it)
    create_call_ms: dict[str, float] = field(default_factory=dict)
    call_to_arrival_ms: dict[str, float] = field(default_factory=dict)
    # pickup: p50 of each step from the create call's return to arrival, in ms (pickup_breakdown)
    pickup_steps_ms: dict[str, float] = field(default_factory=dict)
    statements_per_delivery: float | None = None
    delivered: int = 0
    duplicates: int = 0
    lost: int = 0
    depth: int | None = None
    events_delivered: int | None = None  # --event-endpoints: events that reached the endpoint
    events_per_second: float | None = None  # their rate at the endpoint's receiver, first to last arrival
    events_steady_per_second: float | None = None  # over the middle 80 % of their arrivals
    events_beside_notifications: int | None = None  # events that arrived before the last notification did
    event_duplicates: int = 0
    database: str = ""
    machine: str = ""

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.lost == 0

    def table(self) -> str:
        rows = [
            ("mode", self.mode),
            ("notifications", f"{self.notifications:,}"),
            (
                "dispatcher processes × concurrency / batch",
                f"{self.processes} × {self.concurrency} / {self.batch_size}",
            ),
            ("receiver latency", f"{self.receiver_delay_ms:g} ms"),
        ]
        if self.depth is not None:
            rows.append(("items waiting (depth)", f"{self.depth:,}"))
        if self.enqueue_per_second is not None:
            rows.append(("enqueue rate", f"{self.enqueue_per_second:,.0f} /s"))
        if self.delivered_per_second is not None:
            label = "claim+ack rate" if self.mode == "queue-only" else "delivery rate"
            rows.append((label, f"{self.delivered_per_second:,.0f} /s"))
        if self.steady_per_second is not None:
            rows.append(("delivery rate, middle 80 %", f"{self.steady_per_second:,.0f} /s"))
        if self.wall_seconds is not None:
            rows.append(("wall time", f"{self.wall_seconds:.2f} s"))
        for name, value in self.latency_ms.items():
            rows.append((f"latency {name}", f"{value:.2f} ms"))
        for name, value in self.create_call_ms.items():
            rows.append((f"create call {name}", f"{value:.2f} ms"))
        for name, value in self.call_to_arrival_ms.items():
            rows.append((f"create call start to arrival {name}", f"{value:.2f} ms"))
        for name, value in self.pickup_steps_ms.items():
            rows.append((f"  p50 {name}", f"{value:.3f} ms"))
        if self.statements_per_delivery is not None:
            rows.append(("SQL statements per delivery", f"{self.statements_per_delivery:.3f}"))
        rows += [("delivered", f"{self.delivered:,}"), ("duplicates", str(self.duplicates)), ("lost", str(self.lost))]
        if self.events_delivered is not None:
            rows += [("events delivered", f"{self.events_delivered:,}"),
                     ("event delivery rate", f"{self.events_per_second or 0:,.0f} /s"),
                     ("event delivery rate, middle 80 %", f"{self.events_steady_per_second or 0:,.0f} /s"),
                     ("events delivered beside notifications", f"{self.events_beside_notifications or 0:,}"),
                     ("event duplicates", str(self.event_duplicates))]  # fmt: skip
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": statistics.median(ordered), "p95": pick(0.95), "p99": pick(0.99), "max": ordered[-1]}


# --- setup ----------------------------------------------------------------------------------------------
HOT_TABLES = ("queue_state", "notifications", "delivery_attempts", "dead_letter_queue", "events", "event_deliveries",
              "event_attempts")  # fmt: skip


def wipe_bench_rows(tenant) -> None:  # noqa: ANN001
    """Delete the bench tenant's rows with plain DELETEs: the ORM's cascade would first load every
    row into memory (a million-row queue-only fill took 8 GB)."""
    queue.drop_tenant_items(tenant.pk)
    tables = ("event_attempts", "event_deliveries", "events", "event_endpoints", "scheduled_jobs",
              "dead_letter_queue", "delivery_attempts", "notifications", "providers")  # fmt: skip
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"DELETE FROM {table} WHERE tenant_id = %s", [tenant.pk])  # noqa: S608 - fixed names


def vacuum_hot_tables() -> None:
    """Every round starts from vacuumed tables: on a server without autovacuum (this machine's),
    the rows earlier rounds deleted would otherwise slow each later round (3× after a dozen runs).

    A table left empty (a database of the bench's own) also gets its indexes rebuilt: VACUUM frees
    index pages but never returns them, so after a few dozen runs of 120,000 the notifications'
    primary key held 45 MB for 120,000 rows (8 MB fresh) and the tenant index 85 MB (14 MB), beyond
    shared_buffers, and every run paid for the last one's. graphile-worker, beside which the
    bench is compared, starts each run from a new schema. A table holding other rows is left as it
    is (REINDEX would lock a database in use)."""
    with connection.cursor() as cursor:
        for table in HOT_TABLES:
            cursor.execute(f"VACUUM (ANALYZE) {table}")
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table})")  # noqa: S608 - fixed names
            if not cursor.fetchone()[0]:
                cursor.execute(f"REINDEX TABLE {table}")
                # A BRIN index built on an empty table summarises its first block range, and every insert
                # into that range would then rewrite the summary: left as a new day partition starts.
                for name in [p.name for p in partitions.partitions(table)] or [table]:
                    partitions.unsummarize_if_empty(cursor, name)


def analyze_hot_tables() -> None:
    """ANALYZE after filling, as autovacuum would after 120,000 inserts: the statistics the round
    started with describe the emptied tables, and a plan made from them (a generic plan of a prepared
    statement lives on) mistakes 120,000 queued rows for none."""
    with connection.cursor() as cursor:
        for table in HOT_TABLES:
            cursor.execute(f"ANALYZE {table}")


def bench_tenant_and_provider(url: str, *, failover: bool = False):  # noqa: ANN201
    """`failover`: a second provider to the same receiver follows the first in `failover_order`, and
    the notifications name neither (they go through the order, breakers and all)."""
    from core.models import Tenant
    from providers.models import Provider

    tenant, _ = Tenant.objects.get_or_create(name=BENCH_TENANT)
    # Start from nothing: earlier runs' rows would distort depth and counts.
    wipe_bench_rows(tenant)
    vacuum_hot_tables()
    provider = Provider.objects.create(
        tenant=tenant, name="bench-hook", channel="webhook", kind="webhook",
        config={"url": url, "timeout_seconds": 30}, secrets={"signing_secret": SIGNING_SECRET}, is_default=True,
        failover_order=1 if failover else None,
    )  # fmt: skip
    if failover:
        Provider.objects.create(
            tenant=tenant, name="bench-hook-2", channel="webhook", kind="webhook", failover_order=2,
            config={"url": url, "timeout_seconds": 30}, secrets={"signing_secret": SIGNING_SECRET},
        )  # fmt: skip
    return tenant, provider


def enqueue(tenant, provider, count: int, *, batch: int = 1000, named: bool = True) -> float:  # noqa: ANN001
    """Create `count` notifications through the batch service; returns seconds taken. `named`: False
    when `provider` stands for the first of a failover order (the notifications may fail over)."""
    from notifications.services import NotificationSpec, create_notifications

    body = "Your order #12345 has shipped and will arrive on Thursday. Track it in the app any time."
    started = time.perf_counter()
    for start in range(0, count, batch):
        specs = [
            NotificationSpec(
                channel="webhook",
                recipient=f"https://hooks.example.test/u/{start + i}",
                provider=provider,
                subject="Order shipped",
                body=body,
                metadata={"order": start + i},
                provider_named=named,
            )
            for i in range(min(batch, count - start))
        ]
        create_notifications(tenant, specs, actor="system:omnipost_bench")
    return time.perf_counter() - started


def dispatcher_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS": "true", "DEBUG": "false"}
    # every host of a multi-host URL, target_session_attrs too
    env["DATABASE_URL"] = database_url(settings.DATABASES["default"])
    env.setdefault("SECRET_KEY", "omnipost-bench-only")
    env["OMNIPOST_ENCRYPTION_KEYS"] = ",".join(settings.OMNIPOST_ENCRYPTION_KEYS)
    env["ALLOWED_HOSTS"] = "127.0.0.1"
    env["OMNIPOST_LOG_LEVEL"] = "WARNING"
    return env


def start_dispatchers(
    count: int,
    *,
    concurrency: int,
    batch: int,
    stats_dir: Path,
    listen: bool = True,
    go_file: Path | None = None,
    timeline: bool = False,
) -> list[subprocess.Popen]:
    procs = []
    for i in range(count):
        args = [
            sys.executable, "-m", "benchmarks.dispatcher", "--no-jitter", "--concurrency", str(concurrency),
            "--batch-size", str(batch), "--stats-file", str(stats_dir / f"dispatcher{i}.json"),
        ]  # fmt: skip
        if not listen:
            args.append("--no-listen")
        if timeline:
            args.append("--timeline")
        if go_file is not None:
            args += ["--go-file", str(go_file)]
        procs.append(subprocess.Popen(args, cwd=ROOT, env=dispatcher_env()))  # noqa: S603
    return procs


def release_together(
    procs: list[subprocess.Popen], go_file: Path, *, timeout: float = 120.0, before_go: Callable[[], None] | None = None
) -> None:
    """Wait until every dispatcher has started (its ready file exists), then let them all go at once:
    no process's start-up (≈ 0.7 s of CPU importing Django) runs while another already delivers.
    If they cannot all start, the ones waiting are killed (they would wait for the go forever).
    `before_go` runs once they are all ready, just before the go."""
    deadline = time.monotonic() + timeout
    try:
        while len(list(go_file.parent.glob(f"{go_file.name}.ready.*"))) < len(procs):
            if any(proc.poll() is not None for proc in procs):
                raise RuntimeError("a dispatcher exited before it was ready; see its output above")
            if time.monotonic() > deadline:
                raise RuntimeError(f"dispatchers not ready after {timeout:.0f} s")
            time.sleep(0.01)
        if before_go is not None:
            before_go()
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.wait()
        raise
    go_file.touch()


def stop_when_drained(
    procs: list[subprocess.Popen], tenant, *, poll: float = 0.1, events: bool = False,  # noqa: ANN001
    on_drained: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    """Let the dispatchers run until the tenant's queue is empty (every notification delivered or
    dead-lettered), then stop them as an operator would (SIGTERM: they record and exit 0).
    `on_drained` runs once the queue is empty, while the dispatchers still run.

    Not `run_dispatcher --once`: that ends a dispatcher when nothing is ready *now*, and a retry
    waiting out its backoff is not, so with `--receiver-error-rate` the dispatchers left and the
    run reported the retried notifications as lost."""
    with connection.cursor() as cursor:
        while any(proc.poll() is None for proc in procs):
            cursor.execute("SELECT EXISTS (SELECT 1 FROM queue_state WHERE tenant_id = %s)", [tenant.pk])
            if cursor.fetchone()[0]:
                time.sleep(poll)
                continue
            if events:  # and every event delivered (or given up)
                cursor.execute("SELECT EXISTS (SELECT 1 FROM event_deliveries WHERE tenant_id = %s AND status = "
                               "'pending') OR EXISTS (SELECT 1 FROM events WHERE fanout_pending AND tenant_id = %s)"
                               " OR EXISTS (SELECT 1 FROM event_outcome_batches)",
                               [tenant.pk, tenant.pk])  # fmt: skip
                if cursor.fetchone()[0]:
                    time.sleep(poll)
                    continue
            if on_drained is not None:
                on_drained()
            break
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        proc.wait(timeout=120)


def read_stats(stats_dir: Path) -> dict[str, int]:
    totals: dict[str, int] = {}
    for path in stats_dir.glob("dispatcher*.json"):
        for key, value in json.loads(path.read_text()).items():
            totals[key] = totals.get(key, 0) + int(value)
    return totals


def machine() -> str:
    return f"{os.cpu_count()} cores, {os.uname().machine}, Python {sys.version.split()[0]}"


# --- modes ---------------------------------------------------------------------------------------------
def run_e2e(
    *, count: int, processes: int, concurrency: int, batch: int, delay_ms: float, error_rate: float, verify_every: int,
    event_endpoints: bool = False, failover: bool = False, gate: Callable[[str, list[int]], None] | None = None,
) -> BenchResult:  # fmt: skip
    """`event_endpoints`: the bench tenant also has an event endpoint subscribed to every type, on
    a receiver of its own (so every delivery makes a notification.delivered event), and the run
    lasts until the events are delivered too.

    `gate(phase, dispatcher_pids)` brackets the delivery phase for a measurement from outside:
    "delivering" once the notifications are enqueued and the dispatchers ready, just before the
    go; "drained" once the queue is empty, before the dispatchers are stopped."""
    from notifications.models import Notification

    receiver = ReceiverProcess(
        delay_ms=delay_ms, error_rate=error_rate, verify_every=verify_every, secret=SIGNING_SECRET
    )
    events_receiver = ReceiverProcess(verify_every=verify_every, secret=EVENT_SECRET) if event_endpoints else None
    result = BenchResult(
        "e2e", count, processes, concurrency, batch, delay_ms, database=connection.vendor, machine=machine()
    )
    try:
        tenant, provider = bench_tenant_and_provider(receiver.url, failover=failover)
        if events_receiver is not None:
            from events.services import create_endpoint

            create_endpoint(tenant, name="bench-events", url=events_receiver.url, event_types=["*"],
                            secret=EVENT_SECRET, actor="system:bench")  # fmt: skip
        result.enqueue_per_second = count / enqueue(tenant, provider, count, named=not failover)
        analyze_hot_tables()
        with tempfile.TemporaryDirectory() as stats_dir:
            go_file = Path(stats_dir) / "go"
            procs = start_dispatchers(
                processes, concurrency=concurrency, batch=batch, stats_dir=Path(stats_dir), go_file=go_file
            )
            pids = [proc.pid for proc in procs]
            delivering = None if gate is None else lambda: gate("delivering", pids)
            drained = None if gate is None else lambda: gate("drained", pids)
            release_together(procs, go_file, before_go=delivering)
            started = time.time()
            stop_when_drained(procs, tenant, events=event_endpoints, on_drained=drained)
            result.wall_seconds = time.time() - started
            stats = read_stats(Path(stats_dir))
    finally:
        final, arrivals = receiver.stop()
        if events_receiver is not None:
            event_final, event_arrivals = events_receiver.stop()
            result.events_delivered = len(event_arrivals)
            result.events_per_second = first_to_last_rate(event_arrivals.values())
            result.events_steady_per_second = steady_rate(event_arrivals.values())
            result.event_duplicates = event_final["duplicates"]
    delivered = Notification.objects.filter(tenant=tenant, status="delivered")
    result.delivered = delivered.count()
    result.duplicates = final["duplicates"]
    result.lost = count - len(arrivals) + (count - result.delivered if result.delivered < count else 0)
    result.delivered_per_second = first_to_last_rate(arrivals.values())
    if events_receiver is not None and arrivals:
        last = max(arrivals.values())
        result.events_beside_notifications = sum(1 for t in event_arrivals.values() if t <= last)
    result.steady_per_second = steady_rate(arrivals.values())
    created = dict(delivered.values_list("id", "created_at"))
    result.latency_ms = percentiles(
        [(arrivals[str(i)] - c.timestamp()) * 1000 for i, c in created.items() if str(i) in arrivals]
    )
    if stats.get("delivered"):
        result.statements_per_delivery = stats["statements"] / stats["delivered"]
    return result


PICKUP_WARMUP = 20  # untimed sends first: connections, prepared statements and provider caches warm up

# The steps of a pickup, each from the stamp before it (pickup_breakdown); the last is the sum.
PICKUP_STEPS = (
    ("ring sent (ringer's NOTIFY returned)", "return", "ring_sent"),
    ("ring received (doorbell thread)", "ring_sent", "ring"),
    ("event loop woken (0: claimed on the doorbell thread)", "ring", "rung"),
    ("claim begun (DB or doorbell thread)", "rung", "claim"),
    ("claim statement begun", "claim", "statement"),
    ("claim statement", "statement", "statement_end"),
    ("claim done (routing, providers)", "statement_end", "claimed"),
    ("send started (event loop)", "claimed", "send"),
    ("arrival at the receiver", "send", "arrival"),
    ("create return to claim done", "return", "claimed"),
    ("create return to send started", "return", "send"),
)


class RingerStamps:
    """Wall-clock ends of this process's ringer statements (the create's NOTIFY, queueing.ringer)."""

    def __init__(self) -> None:
        import psycopg

        from queueing import ringer

        self.ends: list[float] = []
        self._original = original = psycopg.Connection.execute
        stamps = self.ends

        def execute(conn, query, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            try:
                return original(conn, query, *args, **kwargs)
            finally:
                if query is ringer._SEND:
                    stamps.append(time.time())

        psycopg.Connection.execute = execute

    def close(self) -> None:
        import psycopg

        psycopg.Connection.execute = self._original


def pickup_breakdown(
    called: dict[str, float], returned: dict[str, float], arrivals: dict[str, float], ring_ends: list[float],
    timelines: list[dict],
) -> dict[str, float]:
    """p50 of each of PICKUP_STEPS over the notifications whose every stamp was found: the ringer's
    first statement to end after the create call began; in the dispatcher that claimed it, the last
    ring and wake-up before that claim began (none after the call began: a claim found it without a
    ring, left out), the claim's and its statement's start and end, its send's start."""
    import bisect

    ring_ends = sorted(ring_ends)
    by_key: dict[str, tuple[dict, dict]] = {}
    for timeline in timelines:
        for claim in timeline["claims"]:
            for key in claim["keys"]:
                by_key[key] = (timeline, claim)
    steps: dict[str, list[float]] = {name: [] for name, _, _ in PICKUP_STEPS}
    for key, back in returned.items():
        if key not in by_key or key not in arrivals or "statement" not in by_key[key][1]:
            continue
        timeline, claim = by_key[key]
        stamps = {"return": back, "claim": claim["start"], "statement": claim["statement"][0],
                  "statement_end": claim["statement"][1], "claimed": claim["end"], "arrival": arrivals[key],
                  "send": timeline["sends"].get(key)}  # fmt: skip
        at = bisect.bisect_left(ring_ends, called[key])
        stamps["ring_sent"] = ring_ends[at] if at < len(ring_ends) else None
        for name, times in (("ring", timeline["rings"]), ("rung", timeline["rungs"])):
            before = [t for t in times if called[key] <= t <= claim["start"]]
            stamps[name] = before[-1] if before else None
        if claim.get("path") == "doorbell":  # claimed on the doorbell thread: no loop woken first
            stamps["rung"] = stamps["ring"]
        if any(v is None for v in stamps.values()):
            continue
        for name, since, until in PICKUP_STEPS:
            steps[name].append((stamps[until] - stamps[since]) * 1000)
    answered = sum(1 for t in timelines for c in t["claims"] if c.get("path") == "doorbell")
    steps_ms = {f"{name} (n={len(v)})": statistics.median(v) for name, v in steps.items() if v}
    steps_ms[f"claims on the doorbell thread: {answered} of {sum(len(t['claims']) for t in timelines)}"] = 0.0
    return steps_ms


def run_pickup(
    *, count: int, rate: float, processes: int, concurrency: int, batch: int, listen: bool = True,
    breakdown: bool = False,
) -> BenchResult:
    """Sends one at a time into idle dispatchers, after PICKUP_WARMUP untimed ones (steady state,
    not cold start: the first few sends open HTTP connections and prepare statements)."""
    from queueing.models import Worker

    receiver = ReceiverProcess(secret=SIGNING_SECRET)
    result = BenchResult(
        "pickup" if listen else "pickup (polling only)",
        count,
        processes,
        concurrency,
        batch,
        0,
        database=connection.vendor,
        machine=machine(),
    )
    returned: dict[str, float] = {}
    called: dict[str, float] = {}  # id → wall time the create call started
    durations: list[float] = []
    timelines: list[dict] = []
    ringer_stamps = RingerStamps() if breakdown else None
    try:
        tenant, provider = bench_tenant_and_provider(receiver.url)
        with tempfile.TemporaryDirectory() as stats_dir:
            before = Worker.objects.live().count()
            procs = start_dispatchers(
                processes, concurrency=concurrency, batch=batch, stats_dir=Path(stats_dir), listen=listen,
                timeline=breakdown,
            )
            deadline = time.time() + 60
            while Worker.objects.live().count() < before + processes and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # let the LISTEN connections settle
            from notifications.services import NotificationSpec, create_notifications

            interval = 1.0 / rate
            next_at = time.perf_counter()
            for i in range(PICKUP_WARMUP + count):
                spec = NotificationSpec(
                    channel="webhook",
                    recipient=f"https://hooks.example.test/{i}",
                    provider=provider,
                    subject="ping",
                    body="pickup latency probe",
                )
                started, clock = time.time(), time.perf_counter()
                (note,) = create_notifications(tenant, [spec], actor="system:omnipost_bench")
                if i >= PICKUP_WARMUP:
                    durations.append((time.perf_counter() - clock) * 1000)
                    returned[str(note.id)] = time.time()
                    called[str(note.id)] = started
                next_at += interval
                time.sleep(max(0.0, next_at - time.perf_counter()))
            time.sleep(1.0)
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)
            if breakdown:
                for stats in Path(stats_dir).glob("dispatcher*.json"):
                    timelines.append(json.loads(stats.read_text())["timeline"])
    finally:
        if ringer_stamps is not None:
            ringer_stamps.close()
        final, arrivals = receiver.stop()
    if ringer_stamps is not None:
        result.pickup_steps_ms = pickup_breakdown(called, returned, arrivals, ringer_stamps.ends, timelines)
    result.delivered = len([i for i in returned if i in arrivals])
    result.duplicates = final["duplicates"]
    result.lost = count - result.delivered
    result.latency_ms = percentiles([(arrivals[i] - t) * 1000 for i, t in returned.items() if i in arrivals])
    result.create_call_ms = percentiles(durations)
    result.call_to_arrival_ms = percentiles([(arrivals[i] - t) * 1000 for i, t in called.items() if i in arrivals])
    return result


def run_queue_only(*, count: int, processes: int, batch: int, depth: int) -> BenchResult:
    """Claim+ack of `count` no-op items while `depth` lower-priority items wait beneath them."""
    from core.models import Tenant

    result = BenchResult(
        "queue-only", count, processes, 0, batch, 0, depth=depth, database=connection.vendor, machine=machine()
    )
    tenant, _ = Tenant.objects.get_or_create(name=BENCH_TENANT)
    _fill_noop(tenant, depth, priority=4)
    _fill_noop(tenant, count, priority=5)
    vacuum_hot_tables()  # both depths start alike, and no autovacuum of the fill runs inside the measurement
    with tempfile.TemporaryDirectory() as out_dir:
        started = time.time()
        procs = [
            subprocess.Popen(  # noqa: S603
                [
                    sys.executable,
                    "-m",
                    "benchmarks.claimer",
                    "--count",
                    str(count // processes + (1 if i < count % processes else 0)),
                    "--batch",
                    str(batch),
                    "--priority",
                    "5",
                    "--out",
                    str(Path(out_dir) / f"c{i}.json"),
                ],
                cwd=ROOT,
                env=dispatcher_env(),
            )
            for i in range(processes)
        ]
        for proc in procs:
            proc.wait()
        result.wall_seconds = time.time() - started
        spans = [json.loads(p.read_text()) for p in Path(out_dir).glob("c*.json")]
    done = sum(s["acked"] for s in spans)
    first = min(s["first"] for s in spans)
    last = max(s["last"] for s in spans)
    result.delivered = done
    result.delivered_per_second = done / (last - first) if last > first else None
    result.lost = max(0, count - done)
    wipe_bench_rows(tenant)
    return result


def _fill_noop(tenant, count: int, *, priority: int) -> None:  # noqa: ANN001
    """Insert `count` notifications with live items in chunks (INSERT … SELECT generate_series)."""
    from providers.models import Provider

    provider, _ = Provider.objects.get_or_create(
        tenant=tenant, name="bench-noop", defaults={"channel": "webhook", "kind": "console"}
    )
    chunk = 200_000
    with connection.cursor() as cursor:
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            insert, params = notifications_insert(tenant.pk, provider.pk, n, priority=priority, queue="bench")
            cursor.execute(
                f"""
                WITH notes AS ({insert} RETURNING id), items AS (
                    SELECT 'bench' AS queue_name, %s AS priority, '{{}}'::jsonb AS payload, 0::float8 AS delay,
                           %s::uuid AS tenant_id, id AS notification_id, %s::bigint AS provider_id
                    FROM notes
                )
                """  # noqa: S608 - fixed fragments
                + queue.insert_items_sql("items s"),
                [*params, priority, tenant.pk, provider.pk],
            )


def new_run_id() -> str:
    return uuid.uuid4().hex[:8]
