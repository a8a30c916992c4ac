"""Native push through the vendors' stand-ins, side by side with the webhook kind, in one sitting.

    .venv/bin/python bench/push_bench.py [--items 2000] [--dispatchers 2]
        [--kinds webhook,webhook-hypercorn,apns,fcm,webpush] [--rate SENDS_PER_S] [--rounds R]
        [--database-url URL] [--profile DIR]

For each kind: a tenant with one provider of that kind, `--items` subscribers with one device each
(webhook: `--items` notifications to a recipient, at tests.support.receivers.HttpReceiver;
webhook-hypercorn: the same at the stand-ins' server, benchmarks.push_standins.HookStandIn), one
push notification each, created before the dispatchers start; then `--dispatchers` `run_dispatcher`
processes drain the queue. Printed per kind: sends/s (items / wall time from the first dispatcher's
start-up line to an empty queue), the dispatchers' CPU per send (utime + stime from /proc, less what
they had spent once started), and for APNs the most streams the stand-in saw in flight at once on
its HTTP/2 connections.

The stand-ins (benchmarks/push_standins.py: hypercorn, verifying tokens and decrypting Web Push bodies)
run in this process, so on a small machine they, not the dispatchers, bound the rate; the CPU per
send is the dispatchers' own. Released all at once, a kind whose stand-in answers faster keeps the
dispatchers busier, their claims fuller and their CPU per send lower: compare kinds' CPU with
`--rate` under the slowest stand-in's rate (the items then go to the dispatchers' queue at that pace,
so every kind is sent at one load), over `--rounds` (the kinds in turn; medians, and each round's
ratios to the webhook kind). Uses (creates, migrates, overwrites) its own database, by default
`omnipost_push_bench`.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.standalone import create_database, setup_django  # noqa: E402

DEFAULT_URL = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_push_bench"
TICKS = os.sysconf("SC_CLK_TCK")


def _setup(url: str) -> None:
    create_database(url)
    setup_django(url)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _seed(kind: str, items: int, standin: object) -> None:
    from core import crypto
    from core.models import Tenant
    from notifications import services
    from notifications.validation import clean_notification
    from providers.models import Provider
    from recipients import devices
    from recipients.models import Device, Subscriber
    from tests.support.receivers import TEST_SIGNING_SECRET

    tenant = Tenant.objects.create(name=f"bench-{kind}-{time.time_ns()}")
    if kind in ("webhook", "webhook-hypercorn"):
        Provider.objects.create(tenant=tenant, name="p", channel="push", kind="webhook", is_default=True,
                                config={"url": standin.url, "timeout_seconds": 10.0},
                                secrets={"signing_secret": TEST_SIGNING_SECRET})  # fmt: skip
        drafts = [{"channel": "push", "recipient": f"tok_{i:08d}", "subject": "s", "body": "b", "queue": "held"}
                  for i in range(items)]  # fmt: skip
    else:
        config, secrets = standin.provider_config()
        Provider.objects.create(tenant=tenant, name="p", channel="push", kind=kind, is_default=True,
                                config=config, secrets=secrets)  # fmt: skip
        subscribers = Subscriber.objects.bulk_create(
            [Subscriber(tenant=tenant, external_id=f"u{i}") for i in range(items)], batch_size=2000)
        rows = []
        for i, subscriber in enumerate(subscribers):
            if kind == "webpush":
                stored = json.dumps(standin.subscribe(f"u{i}").as_json(), separators=(",", ":"))
                identity = json.loads(stored)["endpoint"]
            else:
                stored = identity = f"{i:064x}" if kind == "apns" else f"fcm-{i:08d}"
            rows.append(Device(tenant=tenant, subscriber=subscriber, kind=kind, token=stored,
                               token_masked=devices.mask_token(identity), token_index=crypto.blind_index(identity)))
        Device.objects.bulk_create(rows, batch_size=2000)
        drafts = [{"channel": "push", "subscriber": f"u{i}", "subject": "s", "body": "b", "queue": "held"}
                  for i in range(items)]  # fmt: skip
    for start in range(0, items, 1000):
        batch = [clean_notification(d) for d in drafts[start : start + 1000]]
        services.create_notifications(tenant, services.build_specs(tenant, batch, cached=False), actor="bench")


def _release(rate: float, started: float, released: int, items: int) -> int:
    """Move what `rate` sends/s owes by now (all at once when 0) from the held queue to the
    dispatchers' and ring their doorbell; the count released so far."""
    from django.db import connection

    from queueing.models import QueueItem
    from queueing.queue import NOTIFY_CHANNEL

    owed = items if rate <= 0 else min(items, int((time.monotonic() - started) * rate) + 1)
    if owed <= released:
        return released
    if owed >= items:
        QueueItem.objects.filter(queue_name="held").update(queue_name="go")
    else:
        ids = list(QueueItem.objects.filter(queue_name="held").values_list("pk", flat=True)[: owed - released])
        QueueItem.objects.filter(pk__in=ids).update(queue_name="go")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, 'go')", [NOTIFY_CHANNEL])
    return owed


def _drain(dispatchers: int, env: dict, items: int, profile: Path | None = None, kind: str = "",
           rate: float = 0) -> dict:  # fmt: skip
    from queueing.models import QueueItem

    logs = Path(tempfile.mkdtemp(prefix="push-bench-"))
    procs = []
    for i in range(dispatchers):
        log = open(logs / f"d{i}.log", "w")  # noqa: SIM115
        procs.append(subprocess.Popen([sys.executable, "manage.py", "run_dispatcher", "--no-jitter", "--queues", "go"],
                                      cwd=ROOT, env=env, stdout=log, stderr=log))  # fmt: skip
    deadline = time.monotonic() + 60
    while sum("started (concurrency" in p.read_text() for p in logs.glob("d*.log")) < dispatchers:
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise SystemExit(f"dispatchers did not start (logs: {logs})")
        time.sleep(0.02)
    time.sleep(1.0)  # past their first claims: idle, polling
    spies = []
    if profile is not None:  # py-spy on each dispatcher while it drains (raw stacks, for a flame graph)
        profile.mkdir(parents=True, exist_ok=True)
        spies = [subprocess.Popen([str(ROOT / ".venv/bin/py-spy"), "record", "--pid", str(p.pid), "--rate", "250",
                                   "--format", "raw", "--output", str(profile / f"{kind}-d{i}.txt")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for i, p in enumerate(procs)]  # fmt: skip
        time.sleep(1.0)
    cpu0 = sum(_cpu(p.pid) for p in procs)
    started = time.monotonic()
    # the items were created in a queue nobody claims; now in the dispatchers' queue, all at once or
    # paced at `rate` a second
    released = _release(rate, started, 0, items)
    while released < items or QueueItem.objects.exists():
        if time.monotonic() - started > 110 + (items / rate if rate > 0 else 0):
            break
        time.sleep(0.02)
        released = _release(rate, started, released, items)
    wall = time.monotonic() - started
    cpu = sum(_cpu(p.pid) for p in procs) - cpu0
    for spy in spies:
        spy.send_signal(2)  # py-spy writes its profile on SIGINT
    for spy in spies:
        spy.wait(30)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(20)
    return {"sends_per_s": round(items / wall, 1), "wall_s": round(wall, 2),
            "dispatcher_cpu_us_per_send": round(cpu / items * 1e6, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--dispatchers", type=int, default=2)
    parser.add_argument("--kinds", default="webhook,apns,fcm,webpush",
                        help="also webhook-hypercorn: the webhook kind to the stand-ins' server")
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--profile", type=Path, help="py-spy each dispatcher while it drains; raw stacks go here")
    parser.add_argument("--rate", type=float, default=0,
                        help="release the items at this many a second (0: all at once): CPU per send compared "
                             "at one load, every kind's stand-in keeping up")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="the kinds in turn, this many times; medians")
    args = parser.parse_args()
    _setup(args.database_url)
    from benchmarks.push_standins import ApnsStandIn, FcmStandIn, HookStandIn, WebPushStandIn
    from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

    # INFO: the dispatchers' start-up line is what the bench waits for
    # The dispatchers run as in production, DEBUG off (on, Django logs every statement it runs with its
    # parameters: CPU a send would not cost there); the keys and destinations are the bench process's.
    env = {**os.environ, "DATABASE_URL": args.database_url, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings",
           "DEBUG": "false", "SECRET_KEY": os.environ.get("SECRET_KEY") or "omnipost-bench-only",
           "OMNIPOST_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    from queueing.models import QueueItem

    QueueItem.objects.all().delete()  # what an earlier, interrupted run left queued
    kinds = args.kinds.split(",")
    rounds: list[dict[str, dict]] = []
    for _ in range(args.rounds):
        results: dict[str, dict] = {}
        for kind in kinds:
            standin = {"webhook": lambda: HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=300).start(),
                       "webhook-hypercorn": lambda: HookStandIn().start(),
                       # hypercorn's GOAWAY after 1,000 requests of a connection leaves the streams in
                       # flight unanswered (they time out after 15 s, then are retried): not APNs' habit
                       "apns": lambda: ApnsStandIn(max_requests=10**9).start(), "fcm": lambda: FcmStandIn().start(),
                       "webpush": lambda: WebPushStandIn().start()}[kind]()  # fmt: skip
            try:
                _seed(kind, args.items, standin)
                results[kind] = _drain(args.dispatchers, env, args.items, args.profile, kind, args.rate)
                if kind == "apns":
                    results[kind]["apns_most_streams_in_flight"] = standin.most_in_flight
                if not kind.startswith("webhook"):
                    results[kind]["refused_by_standin"] = len(standin.refused)
            finally:
                standin.stop()
            print(kind, json.dumps(results[kind]), flush=True)
        for base in ("webhook", "webhook-hypercorn"):
            if results.get(base, {}).get("dispatcher_cpu_us_per_send"):
                for figures in results.values():
                    figures[f"cpu_vs_{base}"] = round(
                        figures["dispatcher_cpu_us_per_send"] / results[base]["dispatcher_cpu_us_per_send"], 2)
        rounds.append(results)
    summary = {}
    for kind in kinds:
        runs = [r[kind] for r in rounds]
        summary[kind] = {name: statistics.median(run[name] for run in runs) for name in runs[0]
                         if isinstance(runs[0][name], int | float)}  # fmt: skip
        for name in runs[0]:
            if name.startswith("cpu_"):
                summary[kind][f"{name}_per_round"] = [run[name] for run in runs]
    print(json.dumps({"rate": args.rate, "items": args.items, "rounds": args.rounds, "median": summary}, indent=2))


if __name__ == "__main__":
    main()
