"""A workflow trigger to a topic of a million: fill, fan out, send; exactly once; fairness; memory.

    .venv/bin/python bench/fanout_bench.py [--database-url URL] [--members 1000000] [--kill-at 0.5]
        [--dispatchers 2] [--idle-seconds 10] [--max-seconds 3600] [--runs-only] [--markdown FILE]
        [--probes FILE] [--history N]

On its own database (default `omnipost_bench_fanout` on the local server, dropped and created
afresh): tenant A's topic is filled through the API (`POST topics/{key}/subscribers`, 1,000
external ids a call, the WSGI application in this process), then a workflow of one in-app send step
is triggered to it (`POST workflows/{key}/trigger {"topic"}`) with one real scheduler and
`--dispatchers` real dispatchers running. With `--kill-at F` the scheduler is killed with SIGKILL
once the fan-out has created F of the runs, and a new one is started.

With `--history N`, `notifications` first holds N delivered notifications of the other tenant (a
running system's table; on a fresh one, plans made while it holds a few hundred rows are kept while
the broadcast adds thousands a second, until the janitor's next ANALYZE).

Probes: another tenant's single creates (webhook to a bench receiver) and tenant A's own priority-9
creates, one of each every 50 ms, first on the idle system (dispatchers running, nothing else), then
while the fan-out and its deliveries run; pickup = arrival at the receiver - return of the create.

Unless `--runs-only` or `--no-compare`: then the same count again, as the same in-app notification to
the same members through `POST notifications/batch` (1,000 a call), delivered per second beside the
broadcast's.

Checks (exit 1 when one fails): exactly one run per member and one notification per run; peak RSS
(VmHWM) of every process under 300 MiB; fan-out runs created per second >= 50,000 (without
`--kill-at`); each probe tenant's pickup p99 during the broadcast within 3x of idle. With
`--runs-only` the run ends when the fan-out does (the notifications are not waited for).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SECRET_KEY", "omnipost-bench-only")
os.environ.setdefault("OMNIPOST_ENCRYPTION_KEYS", "x8ROxZ3gJ9D2CFFGZuxGvUQoLhPn7cVeLBcLd2R9s0c=")
os.environ.update(OMNIPOST_ALLOW_PRIVATE_DESTINATIONS="true")
os.environ.setdefault("OMNIPOST_LOG_LEVEL", "WARNING")  # INFO: the processes' logs (under $TMPDIR) say more

MIB = 1024 * 1024
RSS_LIMIT_MIB = 300
RATE_TARGET = 50_000
PICKUP_FACTOR = 3.0


def fresh_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 once gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scheduler_cpu(pid: int) -> float:
    """CPU seconds of a scheduler and of its database sessions (their server processes on this host):
    a figure the machine's other load does not change, unlike the wall clock's."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s", [f"omnipost-scheduler-{pid}-%"]
        )
        backends = [row[0] for row in cursor.fetchall()]
    return cpu_seconds(pid) + sum(cpu_seconds(b) for b in backends)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Procs:
    """The real processes, with the peak RSS of each read before it stops."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.running: dict[str, subprocess.Popen] = {}
        self.peaks: dict[str, float] = {}

    def start(self, name: str, *command: str) -> subprocess.Popen:
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "manage.py", *command],
            cwd=ROOT,
            env=self.env,  # noqa: S603
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        self.running[name] = proc
        return proc

    def sample(self) -> None:
        for name, proc in self.running.items():
            if proc.poll() is None:
                self.peaks[name] = max(self.peaks.get(name, 0.0), peak_rss_mib(proc.pid))

    def kill9(self, name: str) -> None:
        self.sample()
        proc = self.running.pop(name)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        self.sample()
        for proc in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.running.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.running.clear()


class Prober(threading.Thread):
    """One single create for tenant B and one priority-9 create for tenant A every `every` seconds."""

    def __init__(self, tenants, providers, every: float) -> None:  # noqa: ANN001
        super().__init__(daemon=True)
        self.tenants, self.providers, self.every = tenants, providers, every
        self.sent: dict[str, dict[str, float]] = {"other": {}, "own9": {}}
        self.stop_event = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from notifications.services import NotificationSpec, create_notifications

        try:
            while not self.stop_event.is_set():
                for label, tenant, provider, priority in (
                    ("other", self.tenants[1], self.providers[1], 5),
                    ("own9", self.tenants[0], self.providers[0], 9),
                ):
                    spec = NotificationSpec(
                        channel="webhook",
                        recipient="https://example.test/probe",
                        provider=provider,
                        subject="probe",
                        body="probe",
                        priority=priority,
                    )
                    [row] = create_notifications(tenant, [spec], actor="bench")
                    self.sent[label][str(row.pk)] = time.time()
                self.stop_event.wait(self.every)
        finally:
            connection.close()


def probe_phase(tenants, providers, receiver_arrivals, seconds: float, stop_when=None):  # noqa: ANN001, ANN201
    prober = Prober(tenants, providers, 0.05)
    prober.start()
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if stop_when is not None and stop_when():
            break
        time.sleep(0.5)
    prober.stop_event.set()
    prober.join(timeout=30)
    return prober.sent


def history(tenant, provider, count: int) -> None:  # noqa: ANN001
    """`count` delivered notifications of a day ago for `tenant` (one INSERT … SELECT), analyzed: the
    table of a running system rather than a fresh install's, whose statistics (and every plan made on
    them) still say a few hundred rows while the broadcast adds thousands a second."""
    from django.db import connection

    from benchmarks.seeding import notifications_insert
    from notifications.models import Notification

    sample = Notification(tenant=tenant, provider=provider, channel="webhook", recipient="https://example.test/h")
    token = Notification._meta.get_field("recipient").get_prep_value(sample.recipient)
    insert, params = notifications_insert(tenant.pk, provider.pk, count, recipient=token, recipient_masked="h***",
                                          subject="s", body="b", priority=3, status="delivered", age_seconds=86_400)
    with connection.cursor() as cursor:
        cursor.execute(insert, params)
        cursor.execute("VACUUM ANALYZE notifications")
    print(f"history: {count:,} delivered notifications of another tenant", flush=True)


def warm_up(tenant, provider) -> None:  # noqa: ANN001
    """Until the dispatchers deliver: the idle figures are then a running system's, not its start-up's."""
    from notifications.models import Notification
    from notifications.services import NotificationSpec, create_notifications

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        spec = NotificationSpec(channel="webhook", recipient="https://example.test/warm", provider=provider, body="w")
        [row] = create_notifications(tenant, [spec], actor="bench")
        for _ in range(20):
            time.sleep(0.1)
            if Notification.objects.filter(pk=row.pk, status="delivered").exists():
                return
    raise SystemExit("fanout_bench: the dispatchers delivered nothing within 300 s")


def through_the_batch_api(api, tenant, count: int, max_seconds: float) -> dict[str, object]:  # noqa: ANN001
    """The broadcast's count again, as the same in-app notification to the same subscribers through
    `POST notifications/batch` (1,000 a call, in this process like the topic's fill), with the same
    scheduler and dispatchers running: first call → last delivered. Priority 4 tells them apart."""
    from django.db.models import Max
    from django.utils import timezone

    from notifications.models import Notification

    print(f"the same {count:,} through POST notifications/batch", flush=True)
    started, clock = timezone.now(), time.monotonic()
    for start in range(1, count + 1, 1000):
        items = [
            {"channel": "in_app", "subscriber": f"user-{i:08d}", "subject": "Outage", "body": "down", "priority": 4}
            for i in range(start, min(start + 1000, count + 1))
        ]
        response = api.post("/api/v1/notifications/batch", {"notifications": items}, format="json")
        if response.status_code != 201:
            raise SystemExit(f"fanout_bench: a batch answered {response.status_code} {response.content[:200]}")
    created = time.monotonic() - clock
    ours = Notification.objects.filter(tenant=tenant, priority=4)
    while time.monotonic() - clock < max_seconds and ours.filter(status="delivered").count() < count:
        time.sleep(0.5)
    delivered = ours.filter(status="delivered").count()
    last = ours.aggregate(last=Max("delivered_at"))["last"]
    span = (last - started).total_seconds() if last else None
    return {
        "notifications": count, "created_seconds": round(created, 1), "delivered": delivered,
        "first_call_to_last_delivered_seconds": round(span, 1) if span else None,
        "delivered_per_second": round(delivered / span) if span else None,
    }  # fmt: skip


def main() -> int:  # noqa: C901, PLR0915
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgres://postgres:postgres@127.0.0.1:5432/omnipost_bench_fanout")
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--kill-at", type=float, default=None)
    parser.add_argument("--dispatchers", type=int, default=2)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument(
        "--runs-only", action="store_true", help="stop once the fan-out is done: check runs, not their notifications"
    )
    parser.add_argument("--no-compare", action="store_true",
                        help="skip sending the same count through the batch API afterwards")  # fmt: skip
    parser.add_argument("--markdown")
    parser.add_argument("--probes", help="write every probe's creation time and pickup to this TSV file")
    parser.add_argument("--history", type=int, default=0,
                        help="first, this many delivered notifications of another tenant (a running system's table)")
    args = parser.parse_args()

    from benchmarks.receiver import ReceiverProcess
    from benchmarks.standalone import create_database, setup_django

    fresh_database(args.database_url)
    create_database(args.database_url)
    setup_django(args.database_url)
    from django.db import connection
    from rest_framework.test import APIClient

    from core.models import ApiKey, Tenant
    from providers.models import Provider

    receiver = ReceiverProcess(max_seconds=args.max_seconds + 3600)  # it stops by itself after that
    tenant_a, tenant_b = Tenant.objects.create(name="broadcaster"), Tenant.objects.create(name="other")
    hooks = [
        Provider.objects.create(
            tenant=t,
            name="hook",
            kind="webhook",
            channel="webhook",
            is_default=True,
            config={"url": receiver.url},
            secrets={"signing_secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
        )
        for t in (tenant_a, tenant_b)
    ]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiKey.issue(tenant_a, name='bench')[1]}")
    steps = [{"name": "notice", "type": "send", "channel": "in_app", "subject": "Outage", "body": "{{ data.text }}"}]
    assert api.post("/api/v1/workflows", {"key": "outage", "steps": steps}, format="json").status_code == 201
    assert api.put("/api/v1/topics/everyone", {"name": "Everyone"}, format="json").status_code == 201

    results: dict[str, object] = {"members": args.members, "kill_at": args.kill_at}
    started = time.monotonic()
    for start in range(0, args.members, 1000):
        ids = [f"user-{i:08d}" for i in range(start, min(start + 1000, args.members))]
        response = api.post("/api/v1/topics/everyone/subscribers", {"subscribers": ids}, format="json")
        if response.status_code != 200:
            raise SystemExit(f"fanout_bench: membership call failed: {response.status_code} {response.content[:200]}")
    fill = time.monotonic() - started
    count = api.get("/api/v1/topics/everyone").json()["subscriber_count"]
    results["fill_seconds"] = round(fill, 1)
    results["fill_per_second"] = round(args.members / fill)
    print(f"filled {count:,} members in {fill:.1f}s ({args.members / fill:,.0f}/s)", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE topic_subscribers")
        cursor.execute("VACUUM ANALYZE subscribers")
    if args.history:
        history(tenant_b, hooks[1], args.history)

    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"fanout-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    # the processes run as in production: DEBUG off (on, Django keeps every statement a process ran, up
    # to 9,000 of them with their parameters, and a scheduler making a million sends grew past 390 MiB)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings", "DEBUG": "false",
           "DATABASE_URL": args.database_url}  # fmt: skip
    procs = Procs(env, logs)
    checks: dict[str, bool] = {}
    try:
        for i in range(args.dispatchers):
            procs.start(f"dispatcher-{i}", "run_dispatcher", "--no-jitter")
        warm_up(tenant_b, hooks[1])
        idle = probe_phase((tenant_a, tenant_b), hooks, None, args.idle_seconds)
        procs.start("scheduler-1", "run_scheduler", "--no-jitter")
        time.sleep(2.0)
        from notifications.models import Notification
        from workflows.models import Fanout

        response = api.post(
            "/api/v1/workflows/outage/trigger",
            {"topic": "everyone", "data": {"text": "down"}, "actor": "user-00000000"},
            format="json",
        )
        assert response.status_code == 202, response.content
        expected = response.json()["runs"]
        trigger_id = response.json()["trigger_id"]
        triggered, triggered_at = time.monotonic(), time.time()
        print(f"triggered: {expected:,} runs to fan out", flush=True)

        state = {"killed": False, "fanned": None, "cpu": scheduler_cpu(procs.running["scheduler-1"].pid)}

        def watch() -> bool:
            procs.sample()
            fan = Fanout.objects.values("created", "status").get(pk=trigger_id)
            if args.kill_at and not state["killed"] and fan["created"] >= args.kill_at * expected:
                procs.kill9("scheduler-1")
                state["killed"] = True
                results["killed_at_runs"] = fan["created"]
                print(f"kill -9 of the scheduler at {fan['created']:,} runs", flush=True)
                time.sleep(1.0)
                procs.start("scheduler-2", "run_scheduler", "--no-jitter")
            if fan["status"] == "completed" and state["fanned"] is None:
                state["fanned"] = time.monotonic() - triggered
                if not state["killed"]:  # the scheduler's CPU (process and sessions) during the fan-out
                    spent = scheduler_cpu(procs.running["scheduler-1"].pid) - state["cpu"]
                    results["fanout_scheduler_cpu_seconds"] = round(spent, 2)
                    results["fanout_runs_per_scheduler_cpu_second"] = round(fan["created"] / spent) if spent else None
                print(f"fan-out done in {state['fanned']:.1f}s", flush=True)
            if state["fanned"] is None:
                return False
            if args.runs_only:
                return True
            # the count (a scan of up to a million rows) only once nothing is left to send: every 0.5 s it
            # would load the server the probes are measured on
            if Notification.objects.filter(tenant=tenant_a, status__in=["queued", "dispatching"]).exists():
                return False
            return Notification.objects.filter(tenant=tenant_a, priority=5).count() >= expected

        during = probe_phase((tenant_a, tenant_b), hooks, None, args.max_seconds, stop_when=watch)
        probes = [k for sent in (*idle.values(), *during.values()) for k in sent]
        deadline = time.monotonic() + 60  # the last probes' deliveries, before the processes stop
        while time.monotonic() < deadline:
            if not Notification.objects.filter(pk__in=probes).exclude(status="delivered").exists():
                break
            time.sleep(0.2)
        sent_all = time.monotonic() - triggered
        broadcast_cpu = scheduler_cpu(procs.running["scheduler-1"].pid) if not state["killed"] else 0.0
        if not state["killed"] and not args.runs_only and expected:
            # the scheduler's CPU (process and sessions) for the broadcast's sends, past the fan-out's own
            spent = broadcast_cpu - state["cpu"]
            sends = spent - float(results.get("fanout_scheduler_cpu_seconds") or 0.0)
            results["sends_scheduler_cpu_ms_per_notification"] = round(sends * 1000 / expected, 3)
        fan = Fanout.objects.get(pk=trigger_id)
        fan_seconds = (fan.finished_at - fan.created_at).total_seconds()
        results["fanout_seconds"] = round(fan_seconds, 2)
        results["fanout_runs_per_second"] = round(fan.created / fan_seconds) if fan_seconds else None
        results["chunks"] = fan.chunks
        results["trigger_to_all_delivered_seconds"] = round(sent_all, 1)
        if not args.runs_only and not args.no_compare:
            results["batch_api"] = through_the_batch_api(api, tenant_a, expected, args.max_seconds)
        procs.sample()
    finally:
        procs.stop_all()
        final, arrivals = receiver.stop()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(DISTINCT subscriber), count(*) FILTER (WHERE subscriber = 'user-00000000') "
            "FROM workflow_runs WHERE trigger_id = %s",
            [trigger_id],
        )
        runs, distinct, actor_runs = cursor.fetchone()
        cursor.execute(
            "SELECT count(*), count(DISTINCT metadata->>'workflow_run_id'), "
            "count(*) FILTER (WHERE status = 'delivered') FROM notifications "
            "WHERE tenant_id = %s AND priority = 5",
            [tenant_a.pk],
        )
        notes, distinct_notes, delivered = cursor.fetchone()
        # the broadcast's sends: made (created_at) and delivered (delivered_at) per second from the trigger
        cursor.execute(
            "SELECT extract(epoch FROM max(created_at) - %s)::float8,"
            " extract(epoch FROM max(delivered_at) - %s)::float8"
            " FROM notifications WHERE tenant_id = %s AND priority = 5",
            [fan.created_at, fan.created_at, tenant_a.pk],
        )
        made_span, delivered_span = cursor.fetchone()
    results["notifications_made_per_second"] = round(notes / made_span) if notes and made_span else None
    results["delivered_per_second"] = round(delivered / delivered_span) if delivered and delivered_span else None
    results.update(
        runs=runs,
        distinct_subscribers=distinct,
        notifications=notes,
        distinct_run_notifications=distinct_notes,
        delivered=delivered,
        expected=expected,
    )
    checks["exactly one run per member"] = runs == distinct == expected and actor_runs == 0
    if not args.runs_only:
        checks["exactly one notification per run"] = notes == distinct_notes == expected
    rss = {**procs.peaks, "bench (API calls, probes)": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    results["peak_rss_mib"] = {k: round(v, 1) for k, v in rss.items()}
    checks[f"peak RSS of every process < {RSS_LIMIT_MIB} MiB"] = all(v < RSS_LIMIT_MIB for v in rss.values())
    if not args.kill_at:
        checks[f"fan-out >= {RATE_TARGET:,} runs/s"] = (results["fanout_runs_per_second"] or 0) >= RATE_TARGET
    for label, what in (("other", "another tenant's single creates"), ("own9", "the same tenant's priority-9 creates")):
        quiet = [arrivals[k] - t for k, t in idle[label].items() if k in arrivals]
        busy = [arrivals[k] - t for k, t in during[label].items() if k in arrivals]
        results[f"{label}_pickup_ms"] = {
            "idle_p50": round(statistics.median(quiet) * 1000, 1) if quiet else None,
            "idle_p99": round(percentile(quiet, 0.99) * 1000, 1),
            "busy_p50": round(statistics.median(busy) * 1000, 1) if busy else None,
            "busy_p99": round(percentile(busy, 0.99) * 1000, 1),
            "idle_n": len(quiet),
            "busy_n": len(busy),
            "lost": len(during[label]) - len(busy) + len(idle[label]) - len(quiet),
        }
        figures = results[f"{label}_pickup_ms"]
        checks[f"{what}: pickup p99 within {PICKUP_FACTOR:g}x of idle"] = (
            bool(busy) and figures["busy_p99"] <= PICKUP_FACTOR * max(figures["idle_p99"], 1.0) and figures["lost"] == 0
        )
    if args.probes:  # every probe: when it was created (s after the trigger, negative while idle) and its pickup
        with open(args.probes, "w") as out:
            out.write("phase\tlabel\tcreated_s\tpickup_ms\n")
            for phase, sent in (("idle", idle), ("during", during)):
                for label, probes in sent.items():
                    for key, at in sorted(probes.items(), key=lambda kv: kv[1]):
                        pickup = f"{(arrivals[key] - at) * 1000:.1f}" if key in arrivals else "lost"
                        out.write(f"{phase}\t{label}\t{at - triggered_at:.3f}\t{pickup}\n")
    results["receiver"] = final
    results["checks"] = checks
    print(json.dumps(results, indent=2, default=str))
    if args.markdown:
        lines = [f"| {k} | {'PASS' if v else 'FAIL'} |" for k, v in checks.items()]
        Path(args.markdown).write_text(
            "\n".join(
                [
                    "| check | result |",
                    "|---|---|",
                    *lines,
                    "",
                    "```json",
                    json.dumps(results, indent=2, default=str),
                    "```",
                    "",
                ]
            )
        )
    connection.close()
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
