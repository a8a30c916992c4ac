"""The chaos soak: OmniPost's real processes under mixed load while faults are injected, then a
ledger of what survived (bench/soak.py is the command line; tests/benchmarks/test_soak.py runs a
short one).

What runs, all on this machine's loopback:

- a private PostgreSQL server (benchmarks.pgserver: `initdb`, `pg_ctl`), migrated;
- with `standby`: a synchronous streaming standby of it (`pg_basebackup -R`; a commit returns once
  the standby has it, so a failover loses nothing acknowledged), the processes given both servers in
  a multi-host URL with `target_session_attrs=read-write`, so they follow a promotion on their next
  connection;
- with `pooled`: PgBouncer (benchmarks.pgbouncer, transaction pooling; after a failed login to the
  server it refuses clients for 1 s, not its default 15) in front of the primary, the processes
  connecting through it (`OMNIPOST_DATABASE_POOLER=pgbouncer`; LISTEN on a direct
  connection, `OMNIPOST_LISTEN_DATABASE_URL`); with a standby too, PgBouncer is repointed at the
  promoted one by a failover (its configuration rewritten and reloaded);
- 2 web processes (gunicorn gthread), 3 dispatchers, a scheduler and the bounce listener, each
  under a small supervisor (a thread here) that starts it again when it dies;
- the chaos receiver (benchmarks.chaos_receiver): the webhook provider and the tenant's event
  endpoint, switchable to 503 / 429 / hang / down;
- the FCM, APNs and Web Push stand-ins (benchmarks.push_standins, as `SoakFcm`, `SoakApns`,
  `SoakWebPush`): the native push vendors of the tenant's `fcm`, `apns` and `webpush` providers (the
  OAuth grant and FCM v1 sends; HTTP/2 over TLS with ES256 provider tokens; VAPID-signed messages
  that the push service decrypts with the subscription's private key; checked as the vendors would),
  following the same provider faults.

The load, at `rate` notifications a second: single creates (with an `Idempotency-Key`, retried
with the same key on a 5xx or a broken connection until acknowledged), batches of 10, future-dated
sends, sends to subscribers by category (one subscriber in four opted out of it: stored
`suppressed`), and receipts for delivered notifications (signed, some posted twice, some followed
by an older one: out of order), and in-app sends to subscribers' feeds (the built-in `inbox` provider;
one subscriber in five opted out of `news` in-app), whose arrivals are the feed items the dispatcher's
record statement wrote; native push to the devices registered (devices API): an FCM device for
every even subscriber (half of them opted out of `news` push), each message naming itself in
`data.soak_ref`, an APNs device for every odd one (named by `apns-id`, the notification id), and a
Web Push subscription for every third one (named by `data.soak_ref` in the decrypted message), whose
arrivals are what the stand-ins accepted; and triggers of a workflow (send in-app, a 1 s delay, send
push), whose runs the scheduler advances, their send steps' notifications then counted like the rest.
A share of the creates uses the tenant's test key, to the simulator's addresses (email `delivered`,
`bounce`, `permanent`, `transient`; SMS delivered, permanent, transient; the `hook` provider's URL;
an in-app feed). During the run (`Occasional`): triggers of the workflow to a topic of a few hundred
subscribers (filled through the topics API), and one CSV bulk send of BULK_ROWS rows to the `hook`
provider, whose notifications are counted like the rest.

Faults, one every `fault_every` seconds, drawn from a seeded bag (every kind once per round, in a
random order, so a run with at least as many faults as kinds has each kind): FAULT_KINDS, less those
whose mode the run lacks (MODE_KINDS: `pgbouncer_restart` only when pooled, `failover` only with a
standby; naming one without its mode is an error, `unavailable`). kill9's victims come from a bag
too: every process once a round, a dispatcher first. A failover stops the primary (`-m immediate`),
promotes the standby and then rebuilds a new standby from the new primary, on the old primary's port
(so the processes' URL names both servers still), in the background: the fault can recur, and until
the new standby streams a drawn `failover` stays in the bag for a later turn. Every later fault that
acts on the database (`terminate_backends`, `pg_restart`, the leases read at a kill) acts on
whichever server is primary then.

The ledger (`Ledger.failures`): no acknowledged notification lost; duplicates at the provider
only for notifications in flight (leased) at a kill or a stop of a dispatcher, or at a failover (the
leases the promoted server holds: claims whose holders may have sent without being able to record),
never more than were; every delivered notification's event delivered at least once; every receipt acknowledged
and visible; the opted-out sends suppressed and never sent; the API and the provider agree on
what was delivered; every acknowledged workflow trigger has its run, completed, with a notification
for each send step; each topic trigger has exactly one run per member of the topic; the bulk send
completed with exactly one notification per row; each test notification ends as its simulator
address implies (delivered, failed, dead_lettered; its receipt: delivered, bounced), never reaches
a provider's stand-in, the chaos receiver or a feed, and is never listed to the live key; every
process alive at the end (or started again by its supervisor).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from benchmarks.chaos_receiver import ChaosReceiver
from benchmarks.pgbouncer import PrivatePgBouncer
from benchmarks.pgserver import PrivatePostgres, free_port
from benchmarks.push_standins import Answer, ApnsStandIn, FcmStandIn, WebPushStandIn

ROOT = Path(__file__).resolve().parents[1]
DBNAME = "omnipost_soak"
PROVIDER_SECRET = "whsec_" + "U29ha1Byb3ZpZGVyU2lnbmluZ1NlY3JldDAxMjM0NTY="  # noqa: S105 - loopback only
EVENTS_SECRET = "whsec_" + "U29ha0V2ZW50RW5kcG9pbnRTZWNyZXQwMTIzNDU2Nzg="  # noqa: S105 - loopback only
FAULT_KINDS = (
    "terminate_backends",  # pg_terminate_backend of every OmniPost session
    "pg_restart",  # pg_ctl restart -m fast, down for a moment
    "kill9",  # kill -9 of any supervised process
    "sigstop_dispatcher",  # SIGSTOP a dispatcher past its lease, then SIGCONT
    "provider_503",  # the provider answers 503 (Retry-After: 1) for a while
    "provider_429",  # … 429
    "provider_hang",  # … does not answer at all
    "events_down",  # the event endpoint's port is closed for a while
    "scheduler_kill",  # kill -9 of the scheduler
    "pgbouncer_restart",  # kill -9 of PgBouncer, started again on its port after a moment (pooled)
    "failover",  # the primary stopped (immediate), the standby promoted, a new standby rebuilt (standby)
)
MODE_KINDS = {"pgbouncer_restart": "pooled", "failover": "standby"}  # kinds only a run in that mode can draw
STANDBY = "soak_standby"  # its application_name (not omnipost…: terminate_backends leaves replication alone)


def kinds_for(*, pooled: bool = False, standby: bool = False) -> tuple[str, ...]:
    """The fault kinds a run in these modes draws from (all of them, in FAULT_KINDS' order)."""
    modes = {"pooled": pooled, "standby": standby}
    return tuple(kind for kind in FAULT_KINDS if modes.get(MODE_KINDS.get(kind, ""), True))


def unavailable(kinds: tuple[str, ...], *, pooled: bool = False, standby: bool = False) -> str | None:
    """One line saying which of `kinds` this run's modes cannot inject (None: all of them can)."""
    lacking = [kind for kind in kinds if kind not in kinds_for(pooled=pooled, standby=standby)]
    if not lacking:
        return None
    return "; ".join(f"fault kind {kind} needs --{MODE_KINDS[kind]}" for kind in lacking)


KILLS = ("kill9", "sigstop_dispatcher", "scheduler_kill")
RECOVERED_PICKUP = 2.0  # seconds from due to arrival that count as "flowing again" after a fault
SUBSCRIBERS = 40  # sub-0 … sub-39; every fourth opted out of `news` on push, every fifth in-app
FCM_DEVICES = range(0, SUBSCRIBERS, 2)  # subscribers with an FCM device (so half of them opted out of `news` push)
APNS_DEVICES = range(1, SUBSCRIBERS, 2)  # … and with an APNs device (none of them opted out)
WEBPUSH_DEVICES = range(0, SUBSCRIBERS, 3)  # … and with a Web Push subscription (a quarter of them opted out)
NATIVE_PUSH = ("fcm", "apns", "webpush")  # the load's kinds of native push (each its provider's name and kind)
WORKFLOW = "soak"  # its steps: WORKFLOW_STEPS
WORKFLOW_STEPS = [
    {"name": "hello", "type": "send", "channel": "in_app", "subject": "Hello", "body": "Hello {{ data.n }}"},
    {"name": "pause", "type": "delay", "seconds": 1},
    {"name": "nudge", "type": "send", "channel": "push", "provider": "push", "subject": "Nudge",
     "body": "Nudge {{ data.n }}"},
]  # fmt: skip
TOPIC = "soak-topic"  # its members: topic-0 … (a push token each), filled through the topics API
BULK_ROWS = 300  # the bulk send's rows, each to the `hook` provider (the chaos receiver)
BULK_TEMPLATE = "soak-bulk"
# The test key's sends, to the simulator's addresses: (channel, recipient, provider, final status, receipt).
# `{n}` makes each email's domain its own (a hard bounce suppresses its address within the test data).
SIMULATED = (
    ("email", "delivered@{n}.simulator.test", "mail", "delivered", "delivered"),
    ("email", "bounce@{n}.simulator.test", "mail", "delivered", "bounced"),
    ("email", "permanent@{n}.simulator.test", "mail", "failed", None),
    ("email", "transient@{n}.simulator.test", "mail", "dead_lettered", None),
    ("sms", "+15005550006", "text", "delivered", "delivered"),
    ("sms", "+15005550001", "text", "failed", None),
    ("sms", "+15005550004", "text", "dead_lettered", None),
    ("webhook", "https://example.test/hook", "hook", "delivered", None),  # the chaos receiver's provider
    ("in_app", "sub-{i}", "", "delivered", None),  # a feed: no inbox item may be written
)
TEST_FINAL = ("delivered", "failed", "dead_lettered")


@dataclass
class SoakConfig:
    seconds: float = 300.0
    rate: float = 50.0  # notifications a second
    fault_every: float = 20.0
    seed: int = 1
    kinds: tuple[str, ...] | None = None  # None: every kind the modes allow (kinds_for)
    quick: bool = False  # short faults and lease, for the test's soak
    pooled: bool = False  # the processes through PgBouncer; `pgbouncer_restart` in the draw
    standby: bool = False  # a streaming standby; `failover` in the draw
    provider_delay_ms: float = 100.0  # the provider's time to answer: sends are in flight when a kill comes
    dispatchers: int = 3
    webs: int = 2
    workdir: Path | None = None  # logs; a temporary directory when None
    prepare: Callable[[str], None] | None = None  # makes the schema (given a DSN); default: manage.py migrate
    progress: Callable[[str], None] = lambda message: None
    topic_members: int = 300
    topic_triggers: int = 2  # during the run, at even intervals

    def __post_init__(self) -> None:
        if self.kinds is None:
            self.kinds = kinds_for(pooled=self.pooled, standby=self.standby)
        lacking = unavailable(self.kinds, pooled=self.pooled, standby=self.standby)
        if lacking:
            raise ValueError(lacking)

    @property
    def lease_seconds(self) -> float:
        return 4.0 if self.quick else 10.0

    def fault_seconds(self, kind: str) -> float:
        """How long a fault with a duration lasts."""
        # the restarts and the failover: down this long before starting again (promoting the standby)
        quick = {"provider_503": 2.5, "provider_429": 2.5, "provider_hang": 3.0, "events_down": 6.0,
                 "pg_restart": 0.5, "pgbouncer_restart": 0.5, "failover": 0.5}
        full = {"provider_503": 8.0, "provider_429": 8.0, "provider_hang": 6.0, "events_down": 45.0,
                "pg_restart": 2.0, "pgbouncer_restart": 2.0, "failover": 2.0}
        if kind == "sigstop_dispatcher":
            return self.lease_seconds + 2.0
        return (quick if self.quick else full).get(kind, 0.0)

    @property
    def circuit_open_seconds(self) -> float:
        """The providers' breaker stays open this long (default 30 s; shorter here so that one
        provider fault does not hide the next ones behind the same open breaker)."""
        return 3.0 if self.quick else 5.0

    @property
    def drain_seconds(self) -> float:
        return 45.0 if self.quick else 180.0


# --- processes under supervision ---------------------------------------------------------------
@dataclass
class Incarnation:
    pid: int
    started: float
    ended: float | None = None
    code: int | None = None
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (unix time, RSS bytes, open files)


class Supervised:
    """One program kept running: started again (after a short pause) whenever it exits, until
    `stop()`. Each start is an Incarnation; `ready` says when a new one is up (web: /healthz)."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path,
                 ready: Callable[[Supervised], bool]) -> None:  # fmt: skip
        self.name = name
        self.command = command
        self.env = env
        self.log = log
        self.ready = ready
        self.incarnations: list[Incarnation] = []
        self.up_at: list[float] = []  # when each incarnation became ready
        self.proc: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"supervise-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    @property
    def pid(self) -> int | None:
        with self.lock:
            return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def _run(self) -> None:
        while not self.stopping.is_set():
            with self.lock, open(self.log, "a") as out:
                self.proc = subprocess.Popen(  # noqa: S603
                    self.command, cwd=ROOT, env=self.env, stdout=out, stderr=out, start_new_session=True
                )
                incarnation = Incarnation(self.proc.pid, time.time())
                self.incarnations.append(incarnation)
            proc = self.proc
            threading.Thread(target=self._watch_ready, args=(proc,), daemon=True).start()
            code = proc.wait()
            incarnation.ended, incarnation.code = time.time(), code
            if self.stopping.is_set():
                return
            self.stopping.wait(0.3)

    def _watch_ready(self, proc: subprocess.Popen) -> None:
        deadline = time.time() + 60
        while proc.poll() is None and time.time() < deadline:
            if self.ready(self):
                self.up_at.append(time.time())
                return
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        self.stopping.set()
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):  # a gunicorn worker left behind by a killed master
            os.killpg(proc.pid, signal.SIGKILL)
        self.thread.join(15)

    def alive(self) -> bool:
        proc = self.proc
        return proc is not None and proc.poll() is None and self.ready(self)


def answers_http(url: str) -> Callable[[Supervised], bool]:
    """Ready once `url` answers 200 (a web process's /healthz)."""

    def ready(_: Supervised) -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    return ready


def accepts_tcp(port: int) -> Callable[[Supervised], bool]:
    """Ready once the port takes a connection (the bounce listener's SMTP)."""

    def ready(_: Supervised) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return True
        except OSError:
            return False

    return ready


def logged(marker: str) -> Callable[[Supervised], bool]:
    """Ready once the log holds `marker` once per start so far (a dispatcher's "started (concurrency")."""

    def ready(proc: Supervised) -> bool:
        try:
            return proc.log.read_text(errors="replace").count(marker) >= len(proc.incarnations)
        except OSError:
            return False

    return ready


def running(_: Supervised) -> bool:
    return True


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (gunicorn's worker under its master)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
    found, frontier = [pid], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found.extend(frontier)
    return found


def rss_and_files(pid: int) -> tuple[int, int] | None:
    """Resident bytes and open file descriptors of a process and its descendants (None once gone)."""
    rss = files = 0
    for member in _tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
            files += len(os.listdir(f"/proc/{member}/fd"))
        except OSError:
            if member == pid:
                return None
    return rss, files


# --- the load ----------------------------------------------------------------------------------
@dataclass
class Sent:
    kind: str  # single | batch | future | subscriber | inbox | fcm | apns | webpush | workflow (a run's send
    # step) | bulk (a bulk send's row)
    acked_at: float  # unix time of the 201
    due_at: float  # when it could be delivered at the earliest (acked_at, or scheduled_for)
    status: str  # as the 201 gave it
    provider: str  # hook | push | inbox | fcm | apns | webpush


class Api:
    """HTTP to the web processes, round robin, failing over to the next one on a broken connection."""

    def __init__(self, bases: list[str], key: str) -> None:
        self.bases = bases
        self.clients = [httpx.Client(base_url=b, headers={"Authorization": f"Bearer {key}"}, timeout=15)
                        for b in bases]  # fmt: skip
        self.turn = 0
        self.lock = threading.Lock()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with self.lock:
            self.turn += 1
            first = self.turn
        error: Exception | None = None
        for i in range(len(self.clients)):
            try:
                return self.clients[(first + i) % len(self.clients)].request(method, path, **kwargs)
            except httpx.TransportError as exc:
                error = exc
        raise error  # type: ignore[misc]

    def until_ok(self, method: str, path: str, deadline: float, **kwargs: Any) -> tuple[httpx.Response | None, int]:
        """Retried (same arguments: same Idempotency-Key) while the answer is a 5xx or the connection
        breaks, until `deadline`; the last answer (None: none) and the number of tries."""
        tries = 0
        while True:
            tries += 1
            try:
                response = self.request(method, path, **kwargs)
                if response.status_code < 500:
                    return response, tries
            except httpx.TransportError:
                response = None
            if time.time() >= deadline:
                return response, tries
            time.sleep(0.3)

    def close(self) -> None:
        for client in self.clients:
            client.close()


class Load:
    """Creates notifications at `rate` a second, in a mix, through a small thread pool; what the
    API acknowledged goes into `sent`."""

    WEIGHTS = (("single", 0.45), ("batch", 0.2), ("future", 0.1), ("subscriber", 0.15), ("inbox", 0.1),
               ("fcm", 0.07), ("apns", 0.05), ("webpush", 0.05), ("workflow", 0.05), ("test", 0.05))  # fmt: skip

    def __init__(self, api: Api, config: SoakConfig, rng: random.Random, test_api: Api | None = None) -> None:
        self.api, self.config, self.rng, self.test_api = api, config, rng, test_api
        self.sent: dict[str, Sent] = {}
        # the test key's notifications (to the simulator): id → (channel, recipient, final status, receipt)
        self.tests: dict[str, tuple[str, str, str, str | None]] = {}
        self.refs: dict[str, str] = {}  # a native push's `data.soak_ref` → its notification id
        self.triggers: dict[str, float] = {}  # an acknowledged workflow trigger's id → when (unix time)
        self.lock = threading.Lock()
        self.answers: Counter[str] = Counter()
        self.retried = 0
        self.unacknowledged = 0  # creates never acknowledged before their deadline
        self.odd: list[str] = []
        self.offered = 0
        self.shed = 0  # notifications not offered: every client thread busy
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=12, thread_name_prefix="load")
        self.in_flight = 0
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.pool.shutdown(wait=True)

    def _run(self) -> None:
        budget, last = 0.0, time.monotonic()
        kinds, weights = zip(*self.WEIGHTS, strict=True)
        while not self.stopping.wait(0.05):
            now = time.monotonic()
            budget += (now - last) * self.config.rate
            last = now
            while budget >= 1:
                kind = self.rng.choices(kinds, weights)[0]
                size = 10 if kind == "batch" else 1
                budget -= size
                if self.in_flight >= 24:
                    self.shed += size
                    continue
                with self.lock:
                    self.in_flight += 1
                self.offered += size
                to_one = kind in ("subscriber", "inbox", *NATIVE_PUSH, "workflow", "test")
                extra = self.rng.randrange(SUBSCRIBERS) if to_one else self.rng.uniform(1.0, 4.0)
                self.pool.submit(self._one, kind, extra)

    def _one(self, kind: str, extra: float) -> None:
        try:
            self._create(kind, extra)
        except Exception as exc:  # noqa: BLE001 - a load thread reports, never dies
            with self.lock:
                self.odd.append(f"{kind}: {exc!r}"[:300])
        finally:
            with self.lock:
                self.in_flight -= 1

    def _create(self, kind: str, extra: float) -> None:
        if kind == "test":
            self._create_test(int(extra))
            return
        hook = {"channel": "webhook", "recipient": "https://example.test/hook", "provider": "hook",
                "subject": "soak", "body": "soak body"}  # fmt: skip
        path, body, due, provider = "/api/v1/notifications", dict(hook), 0.0, "hook"
        if kind == "batch":
            path, body = "/api/v1/notifications/batch", {"notifications": [dict(hook) for _ in range(10)]}
        elif kind == "future":
            due = time.time() + extra
            body["scheduled_for"] = datetime.fromtimestamp(due, tz=UTC).isoformat()
        elif kind == "subscriber":
            body = {"channel": "push", "subscriber": f"sub-{int(extra)}", "category": "news", "provider": "push",
                    "subject": "news", "body": "news body"}  # fmt: skip
            provider = "push"
        elif kind == "inbox":
            body = {"channel": "in_app", "subscriber": f"sub-{int(extra)}", "category": "news",
                    "subject": "news", "body": "news in the feed"}  # fmt: skip
            provider = "inbox"
        key = str(uuid.uuid4())
        if kind == "fcm":  # native push to the subscriber's FCM device; the vendor's copy names it by `soak_ref`
            body = {"channel": "push", "subscriber": f"sub-{FCM_DEVICES[int(extra) % len(FCM_DEVICES)]}",
                    "category": "news", "provider": "fcm", "subject": "native", "body": "native push body",
                    "data": {"soak_ref": key}}  # fmt: skip
            provider = "fcm"
        elif kind == "apns":  # … to the subscriber's APNs device; the vendor's copy names it by `apns-id`
            body = {"channel": "push", "subscriber": f"sub-{APNS_DEVICES[int(extra) % len(APNS_DEVICES)]}",
                    "category": "news", "provider": "apns", "subject": "native",
                    "body": "native push body"}  # fmt: skip
            provider = "apns"
        elif kind == "webpush":  # … to the subscriber's browser; the decrypted message names it by `soak_ref`
            body = {"channel": "push", "subscriber": f"sub-{WEBPUSH_DEVICES[int(extra) % len(WEBPUSH_DEVICES)]}",
                    "category": "news", "provider": "webpush", "subject": "native", "body": "native push body",
                    "data": {"soak_ref": key}}  # fmt: skip
            provider = "webpush"
        elif kind == "workflow":
            path = f"/api/v1/workflows/{WORKFLOW}/trigger"
            body = {"subscribers": [f"sub-{int(extra)}"], "data": {"n": key[:8]}}
        headers = {"Idempotency-Key": key}
        response, tries = self.api.until_ok("POST", path, time.time() + 30, json=body, headers=headers)
        acked = time.time()
        with self.lock:
            self.retried += tries - 1
            self.answers[str(response.status_code) if response is not None else "no answer"] += 1
            if response is None or response.status_code not in ((202,) if kind == "workflow" else (200, 201)):
                self.unacknowledged += 10 if kind == "batch" else 1
                if response is not None:
                    self.odd.append(f"{kind} {response.status_code}: {response.text[:200]}")
                return
            if kind == "workflow":
                self.triggers[response.json()["trigger_id"]] = acked
                return
            rows = response.json()["results"] if kind == "batch" else [response.json()]
            for row in rows:
                self.sent[row["id"]] = Sent(kind, acked, max(acked, due), row["status"], provider)
            if kind in ("fcm", "webpush"):
                self.refs[key] = rows[0]["id"]

    def _create_test(self, draw: int) -> None:
        """A test key's notification to one of the simulator's addresses (SIMULATED, by `draw`)."""
        key = str(uuid.uuid4())
        channel, recipient, provider, status, receipt = SIMULATED[(draw + len(self.tests)) % len(SIMULATED)]
        recipient = recipient.format(n=key[:12], i=draw)
        body = {"channel": channel, "subject": "simulated", "body": "simulated body"}
        if channel == "in_app":
            body["subscriber"] = recipient
        else:
            body |= {"recipient": recipient, "provider": provider}
        assert self.test_api is not None
        response, tries = self.test_api.until_ok("POST", "/api/v1/notifications", time.time() + 30, json=body,
                                                 headers={"Idempotency-Key": key})  # fmt: skip
        with self.lock:
            self.retried += tries - 1
            self.answers[str(response.status_code) if response is not None else "no answer"] += 1
            if response is None or response.status_code != 201 or response.json().get("test") is not True:
                self.unacknowledged += 1
                if response is not None:
                    self.odd.append(f"test {response.status_code}: {response.text[:200]}")
                return
            self.tests[response.json()["id"]] = (channel, recipient, status, receipt)


class _Faulted:
    """A push vendor's stand-in as the soak's: it accepts after `delay` seconds (so sends are in
    flight when a kill comes) and follows the provider faults as the chaos receiver's provider does:
    `mode` 503 or 429 (Retry-After: 1), or `hang`: no answer until the fault ends, then a 503."""

    lock: threading.Lock
    seen: Counter[str]
    received: list[dict[str, Any]]
    delay = 0.0
    mode = "ok"
    mode_until = 0.0  # when the fault ends (unix time), for `hang`

    def set_mode(self, mode: str, until: float = 0.0) -> None:
        self.mode, self.mode_until = mode, until

    def _next(self, token: str) -> Answer:
        with self.lock:
            self.seen[token] += 1
        mode = self.mode
        if mode in ("503", "429"):
            return Answer(int(mode), headers={"Retry-After": "1"}, delay=self.delay)
        if mode == "hang":
            return Answer(503, delay=max(self.delay, self.mode_until - time.time()))
        return Answer(200, delay=self.delay)


class SoakFcm(_Faulted, FcmStandIn):
    """The FCM stand-in, faulted as the soak's provider is."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def arrivals(self) -> list[tuple[str, float]]:
        """(soak_ref, when) of each accepted message, duplicates included."""
        with self.lock:
            return [((r["message"].get("data") or {}).get("soak_ref", ""), r["at"]) for r in self.received]


class SoakApns(_Faulted, ApnsStandIn):
    """The APNs stand-in (HTTP/2 over TLS), faulted as the soak's provider is."""

    def __init__(self, delay: float, directory: Path) -> None:
        super().__init__(directory)
        self.delay = delay

    def arrivals(self) -> list[tuple[str, float]]:
        """(apns-id: the notification id, when) of each accepted message, duplicates included."""
        with self.lock:
            return [(r["headers"].get("apns-id", ""), r["at"]) for r in self.received]


class SoakWebPush(_Faulted, WebPushStandIn):
    """The Web Push stand-in (VAPID checked, each message decrypted with http_ece and the
    subscription's private key), faulted as the soak's provider is."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def arrivals(self) -> list[tuple[str, float]]:
        """(soak_ref, when) of each accepted message, as decrypted, duplicates included."""
        with self.lock:
            return [((r["payload"].get("data") or {}).get("soak_ref", ""), r["at"]) for r in self.received]


# --- faults ------------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str
    started: float
    ended: float | None = None
    target: str = ""
    detail: str = ""
    in_flight: list[str] | None = None  # kills and stops of a dispatcher: its leased notifications
    recovered_after: float | None = None  # filled by the ledger


class Faults:
    """One fault every `fault_every` seconds, drawn from a seeded bag of `kinds`."""

    def __init__(self, soak: Soak, rng: random.Random) -> None:
        self.soak, self.rng = soak, rng
        self.done: list[Fault] = []
        self.bag: list[str] = []
        self.victims: list[str] = []
        self.errors: list[str] = []
        self.generation: Counter[str] = Counter()
        self.stopping = threading.Event()
        self.timers: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._run, name="faults", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop_injecting(self) -> None:
        """No new fault from now on; those under way end as they would have."""
        self.stopping.set()
        self.thread.join(60)

    def stop(self) -> None:
        self.stop_injecting()
        for timer in self.timers:
            timer.join(60)

    def settled(self, margin: float) -> bool:
        """Every fault injected so far ended at least `margin` seconds ago."""
        now = time.time()
        return all(f.ended is not None and now >= f.ended + margin for f in self.done)

    def draw(self) -> str | None:
        """The next kind from the bag (refilled and shuffled when empty). A kind that cannot be injected
        now (`ready`: a failover while the new standby is still being built) stays in the bag for a
        later draw; None when the bag holds only such kinds."""
        if not self.bag:
            self.bag = list(self.soak.config.kinds or ())
            self.rng.shuffle(self.bag)
        for i in range(len(self.bag) - 1, -1, -1):
            if self.ready(self.bag[i]):
                return self.bag.pop(i)
        return None

    def ready(self, kind: str) -> bool:
        return kind != "failover" or getattr(self.soak, "standby", None) is not None

    def _run(self) -> None:
        # on a fixed cadence from the start: a fault that takes a while to inject (a SIGSTOP held past
        # the lease, a restart on a loaded machine) does not push every later one back
        every = self.soak.config.fault_every
        next_at = time.monotonic() + every
        while not self.stopping.wait(max(0.0, next_at - time.monotonic())):
            next_at += every
            kind = self.draw()
            if kind is None:
                self.soak.config.progress("no fault this turn: the standby is still being rebuilt")
                continue
            fault = Fault(kind, time.time())
            self.done.append(fault)
            self.soak.config.progress(f"fault {len(self.done)}: {kind}")
            try:
                getattr(self, kind)(fault)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
                fault.detail += f" (injection failed: {exc!r})"[:300]
                fault.ended = fault.ended or time.time()
                self.errors.append(f"{kind}: {exc!r}"[:300])

    def later(self, seconds: float, action: Callable[[], None]) -> None:
        def run() -> None:
            time.sleep(seconds)  # not cut short by stop(): a fault always ends as it would have
            action()

        timer = threading.Thread(target=run, daemon=True)
        self.timers.append(timer)
        timer.start()

    # the kinds -------------------------------------------------------------------------------
    def terminate_backends(self, fault: Fault) -> None:
        primary = self.soak.pg
        fault.target = f"port {primary.port}"
        count = primary.sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'omnipost%%' AND pid <> pg_backend_pid()"
        )
        fault.detail = f"{count} sessions"
        fault.ended = time.time()

    def pg_restart(self, fault: Fault) -> None:
        primary = self.soak.pg
        down = primary.restart("fast", down_seconds=self.soak.config.fault_seconds("pg_restart"))
        fault.target, fault.detail = f"port {primary.port}", f"unreachable {down:.1f} s"
        fault.ended = time.time()

    def pgbouncer_restart(self, fault: Fault) -> None:
        """PgBouncer killed (every client's connection breaks), started again on its port."""
        bouncer = self.soak.bouncer
        began = time.monotonic()
        bouncer.kill()
        time.sleep(self.soak.config.fault_seconds("pgbouncer_restart"))
        bouncer.start()
        fault.target, fault.detail = f"port {bouncer.port}", f"unreachable {time.monotonic() - began:.1f} s"
        fault.ended = time.time()

    def failover(self, fault: Fault) -> None:
        """The primary stopped (`-m immediate`: no goodbye to anyone), the standby promoted, PgBouncer
        (when pooled) repointed at it; the leases the promoted server holds are the fault's in-flight
        set. A new standby is then built from it in the background (`Soak.rebuild_standby`)."""
        soak = self.soak
        old, new = soak.pg, soak.standby
        began = time.monotonic()
        soak.standby = None
        old.stop("immediate")
        time.sleep(soak.config.fault_seconds("failover"))
        new.promote()
        soak.pg = new
        if soak.bouncer is not None:
            soak.bouncer.repoint(new.port)
        down = time.monotonic() - began
        fault.ended = time.time()
        fault.target = f"port {old.port} → {new.port}"
        fault.in_flight = soak.leased()
        fault.detail = f"no primary {down:.1f} s; {len(fault.in_flight)} leased"
        self.later(0, lambda: soak.rebuild_standby(old, fault))

    def victim(self) -> str:
        """The next process for kill9: every process once a round, in a seeded order, a dispatcher
        first (the kill that can make duplicates, so a short soak has one)."""
        if not self.victims:
            names = sorted(self.soak.procs)
            dispatchers = [n for n in names if n.startswith("dispatcher")]
            first = self.rng.choice(dispatchers)
            rest = [n for n in names if n != first]
            self.rng.shuffle(rest)
            self.victims = [first, *rest]
        return self.victims.pop(0)

    def kill9(self, fault: Fault, name: str | None = None) -> None:
        name = name or self.victim()
        proc = self.soak.procs[name]
        pid = proc.pid
        fault.target = name
        if pid is None:
            fault.detail, fault.ended = "not running", time.time()
            return
        if name.startswith("dispatcher"):
            self.soak.busy()
        os.kill(pid, signal.SIGKILL)
        if name.startswith("dispatcher"):
            fault.in_flight = self.soak.leased()
            fault.detail = f"{len(fault.in_flight)} leased"
        starts = len(proc.up_at)

        def restarted() -> None:
            deadline = time.time() + 90
            while len(proc.up_at) <= starts and time.time() < deadline:
                time.sleep(0.05)
            fault.ended = proc.up_at[starts] if len(proc.up_at) > starts else None

        self.later(0, restarted)

    def scheduler_kill(self, fault: Fault) -> None:
        self.kill9(fault, "scheduler")

    def sigstop_dispatcher(self, fault: Fault) -> None:
        name = self.rng.choice(sorted(n for n in self.soak.procs if n.startswith("dispatcher")))
        pid = self.soak.procs[name].pid
        fault.target = name
        if pid is None:
            fault.detail, fault.ended = "not running", time.time()
            return
        self.soak.busy()
        os.kill(pid, signal.SIGSTOP)
        fault.in_flight = self.soak.leased()
        seconds = self.soak.config.fault_seconds("sigstop_dispatcher")
        fault.detail = f"{len(fault.in_flight)} leased, stopped {seconds:g} s"

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            fault.ended = time.time()

        self.later(seconds, resume)

    def _mode(self, fault: Fault, target: str, mode: str) -> None:
        self.generation[target] += 1
        mine = self.generation[target]
        seconds = self.soak.config.fault_seconds(fault.kind)
        self.soak.receiver.mode(target, mode)
        if target == "provider":  # the native push vendors too
            for vendor in (self.soak.fcm, self.soak.apns, self.soak.webpush):
                vendor.set_mode(mode, time.time() + seconds)
        fault.target, fault.detail = target, f"{mode} for {seconds:g} s"

        def end() -> None:
            if self.generation[target] == mine:  # a later fault of the same target ends it instead
                self.soak.receiver.mode(target, "ok")
                if target == "provider":
                    for vendor in (self.soak.fcm, self.soak.apns, self.soak.webpush):
                        vendor.set_mode("ok")
            fault.ended = time.time()

        self.later(seconds, end)

    def provider_503(self, fault: Fault) -> None:
        self._mode(fault, "provider", "503")

    def provider_429(self, fault: Fault) -> None:
        self._mode(fault, "provider", "429")

    def provider_hang(self, fault: Fault) -> None:
        self._mode(fault, "provider", "hang")

    def events_down(self, fault: Fault) -> None:
        self._mode(fault, "events", "down")


# --- receipts ----------------------------------------------------------------------------------
class Receipts:
    """Follows the provider's accepted requests and posts signed `delivered` receipts for one in
    five of the `hook` provider's notifications: one in four of those twice (the same event id),
    and one in four followed by an older event of its own (out of order)."""

    def __init__(self, soak: Soak, rng: random.Random) -> None:
        from standardwebhooks import Webhook

        self.soak, self.rng = soak, rng
        self.signer = Webhook(PROVIDER_SECRET)
        self.posted: dict[str, int] = {}  # notification id → receipts acknowledged (2xx)
        self.failed: list[str] = []
        self.arrived: dict[str, float] = {}  # provider side, followed live: notification id → first arrival
        self.seen = 0
        self.feed_since = 0.0
        self.following = threading.Lock()
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="receipts")
        self.thread = threading.Thread(target=self._run, name="receipts", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.pool.shutdown(wait=True)

    def follow(self) -> list[str]:
        """New arrivals at the provider, the native push vendor and in the feeds (the receipts'
        candidates and the drain's progress)."""
        with self.following:
            rows = self.soak.receiver.accepted_since("provider", self.seen)
            self.seen += len(rows)
            feed = self.soak.inbox_arrivals(self.feed_since)
            if feed:
                # commits land out of created_at order: read a minute back again (arrivals are a dict)
                self.feed_since = max(self.feed_since, max(at for _, at in feed) - 60)
            pushed = self.soak.push_arrivals()
            fresh = []
            for _webhook_id, notification_id, at in [*rows, *(("", i, at) for i, at in [*feed, *pushed])]:
                if notification_id not in self.arrived:
                    self.arrived[notification_id] = at
                    fresh.append(notification_id)
            return fresh

    def _run(self) -> None:
        while not self.stopping.wait(1.0):
            try:
                fresh = self.follow()
            except httpx.HTTPError:
                continue
            for notification_id in fresh:
                sent = self.soak.load.sent.get(notification_id)
                if sent is None or sent.provider != "hook" or self.rng.random() >= 0.2:
                    continue
                self.pool.submit(self._post, notification_id, self.rng.random())

    def _post(self, notification_id: str, draw: float) -> None:
        now = datetime.now(tz=UTC)
        events = [(f"rcpt-{uuid.uuid4().hex}", now)]
        if draw < 0.25:
            events.append(events[0])  # the same event again
        elif draw < 0.5:
            events.append((f"rcpt-{uuid.uuid4().hex}", now - timedelta(seconds=30)))  # an older one, after
        for event_id, at in events:
            body = json.dumps({"type": "delivered", "notification_id": notification_id,
                               "occurred_at": at.isoformat()})  # fmt: skip
            deadline = time.time() + 60
            while True:
                stamp = datetime.now(tz=UTC)
                headers = {"webhook-id": event_id, "webhook-timestamp": str(int(stamp.timestamp())),
                           "webhook-signature": self.signer.sign(event_id, stamp, body),
                           "content-type": "application/json"}  # fmt: skip
                try:
                    response = self.soak.api.request("POST", f"/hooks/providers/{self.soak.hook_id}",
                                                     content=body, headers=headers)  # fmt: skip
                    if response.status_code < 300:
                        self.posted[notification_id] = self.posted.get(notification_id, 0) + 1
                        break
                    if response.status_code < 500 and response.status_code != 429:
                        self.failed.append(f"{notification_id}: {response.status_code} {response.text[:200]}")
                        break
                except httpx.TransportError:
                    pass
                if time.time() > deadline:
                    self.failed.append(f"{notification_id}: not acknowledged within 60 s")
                    break
                time.sleep(0.3)


# --- topic triggers and a bulk send ------------------------------------------------------------
class Occasional:
    """During the load: `topic_triggers` triggers of the workflow to the topic, and one bulk send of
    BULK_ROWS rows to the `hook` provider (a CSV, started, followed until `completed`; its rows'
    notifications then join the load's `sent`, counted like the rest)."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.topic_triggers: dict[str, int] = {}  # trigger id → runs the 202 announced
        self.bulk: dict[str, Any] = {}  # the job as last read, with `rows_seen`: its notifications' rows
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="occasional", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, within: float) -> None:
        """Wait (up to `within` seconds) until the bulk send completed and its notifications are known."""
        self.thread.join(within)
        self.stopping.set()
        self.thread.join(10)

    def _run(self) -> None:
        seconds = self.soak.config.seconds
        count = self.soak.config.topic_triggers
        # the bulk send at 40 % of the run, the topic triggers spread over it
        plan = sorted([(seconds * (i + 1) / (count + 1), "topic") for i in range(count)] + [(seconds * 0.4, "bulk")])
        started = time.time()
        for at, what in plan:
            if self.stopping.wait(max(0.0, started + at - time.time())):
                return
            try:
                self.trigger_topic() if what == "topic" else self.send_bulk()
            except Exception as exc:  # noqa: BLE001 - reported by the ledger
                self.errors.append(f"{what}: {exc!r}"[:300])

    def trigger_topic(self) -> None:
        load = self.soak.load
        body = {"topic": TOPIC, "data": {"n": f"topic{len(self.topic_triggers)}"}}
        response, _ = self.soak.api.until_ok("POST", f"/api/v1/workflows/{WORKFLOW}/trigger", time.time() + 30,
                                             json=body, headers={"Idempotency-Key": str(uuid.uuid4())})  # fmt: skip
        if response is None or response.status_code != 202:
            raise RuntimeError(f"topic trigger: {response and response.status_code} {response and response.text[:200]}")
        answer = response.json()
        with load.lock:
            load.triggers[answer["trigger_id"]] = time.time()
        self.topic_triggers[answer["trigger_id"]] = answer["runs"]
        self.soak.config.progress(f"topic trigger {answer['trigger_id']}: {answer['runs']} runs")

    def send_bulk(self) -> None:
        api = self.soak.api
        csv = "recipient\n" + "https://example.test/hook\n" * BULK_ROWS
        body = {"csv": csv, "channel": "webhook", "template": BULK_TEMPLATE, "name": "soak"}
        response, _ = api.until_ok("POST", "/api/v1/bulk-sends", time.time() + 30, json=body,
                                   headers={"Idempotency-Key": str(uuid.uuid4())})  # fmt: skip
        if response is None or response.status_code != 201:
            raise RuntimeError(f"bulk send: {response and response.status_code} {response and response.text[:200]}")
        self.bulk = job = response.json()
        response, _ = api.until_ok("POST", f"/api/v1/bulk-sends/{job['id']}/start", time.time() + 30)
        if response is None or response.status_code not in (200, 202, 409):
            raise RuntimeError(f"bulk start: {response and response.status_code} {response and response.text[:200]}")
        begun = time.time()
        self.soak.config.progress(f"bulk send {job['id']} started ({job['rows']} rows)")
        deadline = begun + self.soak.config.drain_seconds + self.soak.config.seconds
        while not self.stopping.is_set() and time.time() < deadline:
            response, _ = api.until_ok("GET", f"/api/v1/bulk-sends/{job['id']}", deadline)
            if response is not None and response.status_code == 200:
                self.bulk = response.json()
                if self.bulk["status"] not in ("ready", "sending"):
                    break
            time.sleep(0.5)
        rows: list[int] = []
        url: str | None = f"/api/v1/bulk-sends/{job['id']}/notifications?limit=500"
        while url:
            response, _ = api.until_ok("GET", url, time.time() + 60)
            if response is None or response.status_code != 200:
                raise RuntimeError(f"bulk notifications: {response and response.status_code}")
            page = response.json()
            with self.soak.load.lock:
                for row in page["results"]:
                    rows.append(row["row"])
                    self.soak.load.sent.setdefault(row["id"], Sent("bulk", begun, begun, row["status"], "hook"))
            url = page.get("next")
        self.bulk["rows_seen"] = rows


# --- the run -----------------------------------------------------------------------------------
class Soak:
    def __init__(self, config: SoakConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)  # noqa: S311 - reproducible draws, not secrets
        self.procs: dict[str, Supervised] = {}
        self.samples_started = 0.0
        self.standby: PrivatePostgres | None = None  # None: none configured, or being rebuilt after a failover
        self.bouncer: PrivatePgBouncer | None = None
        self.ports: list[int] = []  # the servers' ports, primary first at the start (a failover swaps roles)
        self.closing = threading.Event()
        self.servers = threading.Lock()

    # the servers -------------------------------------------------------------------------------
    def _start_servers(self) -> None:
        """The primary, its standby (with `standby`) and PgBouncer in front of the primary (`pooled`)."""
        settings = {"max_connections": "200"}
        if self.config.standby:  # commits wait for the standby; it retries a lost primary every 0.5 s
            settings |= {"synchronous_commit": "on", "wal_retrieve_retry_interval": "500ms"}
        self.pg = PrivatePostgres(settings=settings)
        self.pg.start()
        self.pg.create_database(DBNAME)
        self.ports = [self.pg.port]
        if self.config.standby:
            self.standby = self.pg.standby(name=STANDBY)
            self.ports.append(self.standby.port)
        if self.config.pooled:
            self.bouncer = PrivatePgBouncer(self.pg.url(DBNAME), server_login_retry=1).start()

    def direct_url(self) -> str:
        """The database's URL straight to the servers: every one of them, the writable one chosen."""
        if len(self.ports) == 1:
            return self.pg.url(DBNAME)
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgres://postgres@{hosts}/{DBNAME}?target_session_attrs=read-write"

    def rebuild_standby(self, failed: PrivatePostgres, fault: Fault) -> None:
        """After a failover: a new standby of the new primary on the failed primary's port (its data
        removed), retried until it streams (a pg_restart of the primary meanwhile breaks a base backup)."""
        began = time.time()
        port = failed.port
        failed.close()
        while not self.closing.is_set() and time.time() < began + 300:
            primary = self.pg
            try:
                standby = primary.standby(name=STANDBY, port=port, timeout=120)
            except Exception as exc:  # noqa: BLE001 - tried again, and said
                self.config.progress(f"rebuilding the standby failed, again: {exc!r}"[:300])
                self.closing.wait(1.0)
                continue
            with self.servers:
                if self.closing.is_set():
                    standby.close()
                    return
                self.standby = standby
            fault.detail += f"; new standby streaming after {time.time() - began:.1f} s"
            self.config.progress(f"new standby on port {port} after {time.time() - began:.1f} s")
            return
        fault.detail += "; no new standby"

    def _stop_servers(self) -> None:
        self.closing.set()
        if self.bouncer is not None:
            self.bouncer.close()
        with self.servers:
            for server in (self.standby, getattr(self, "pg", None)):
                if server is not None:
                    server.close()

    # set-up ------------------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        from cryptography.fernet import Fernet

        ours = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "OMNIPOST_DATABASE_POOLER", "OMNIPOST_LISTEN_DATABASE_URL")
        env = {k: v for k, v in os.environ.items() if k not in ours}
        if self.bouncer is not None:  # through the pooler; LISTEN straight to the servers
            env |= {"DATABASE_URL": self.bouncer.url(DBNAME), "OMNIPOST_DATABASE_POOLER": "pgbouncer",
                    "OMNIPOST_LISTEN_DATABASE_URL": self.direct_url()}
        else:
            env["DATABASE_URL"] = self.direct_url()
        return {
            **env, "DEBUG": "false", "SECRET_KEY": uuid.uuid4().hex * 2,
            "ALLOWED_HOSTS": "127.0.0.1,localhost", "OMNIPOST_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
            "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS": "true", "OMNIPOST_LOG_LEVEL": "WARNING",
            "OMNIPOST_RATE_LIMIT_API": "0", "OMNIPOST_RATE_LIMIT_RECEIPTS": "0", "CONN_MAX_AGE": "60",
            "OMNIPOST_RETRY_BASE_SECONDS": "0.5", "OMNIPOST_RETRY_MAX_SECONDS": "4", "OMNIPOST_MAX_ATTEMPTS": "100",
            "OMNIPOST_LEASE_SECONDS": str(self.config.lease_seconds), "PYTHONUNBUFFERED": "1",
            "OMNIPOST_BOUNCE_DOMAIN": "bounces.soak.test",
        }  # fmt: skip

    def _manage(self, *args: str, env: dict[str, str]) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,  # noqa: S603
                              text=True, timeout=300, check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed: {done.stderr.strip()[-1500:]}")
        return done.stdout

    def _setup_tenant(self, env: dict[str, str]) -> None:
        created = json.loads(self._manage("create_tenant", "soak", "--json", env=env).strip().splitlines()[-1])
        self.api = Api([f"http://127.0.0.1:{port}" for port in self.web_ports], created["api_key"])
        self.test_api = Api([f"http://127.0.0.1:{port}" for port in self.web_ports], created["test_api_key"])
        deadline = time.time() + 60

        def must(method: str, path: str, body: dict) -> dict:
            response, _ = self.api.until_ok(method, path, deadline, json=body)
            if response is None or response.status_code >= 300:
                raise RuntimeError(f"{method} {path}: {response and response.status_code} {response and response.text}")
            return response.json()

        for name, channel in (("hook", "webhook"), ("push", "push")):
            provider = must("POST", "/api/v1/providers", {
                "name": name, "channel": channel, "kind": "webhook", "max_attempts": 100, "is_default": name == "hook",
                "config": {"url": self.receiver.provider_url, "timeout_seconds": 2},
                "circuit": {"open_seconds": self.config.circuit_open_seconds},
                "secrets": {"signing_secret": PROVIDER_SECRET}})  # fmt: skip
            if name == "hook":
                self.hook_id = provider["id"]
        for kind, vendor in (("fcm", self.fcm), ("apns", self.apns), ("webpush", self.webpush)):
            vendor_config, vendor_secrets = vendor.provider_config()
            must("POST", "/api/v1/providers", {
                "name": kind, "channel": "push", "kind": kind, "max_attempts": 100, "config": vendor_config,
                "circuit": {"open_seconds": self.config.circuit_open_seconds}, "secrets": vendor_secrets})  # fmt: skip
        # email and SMS providers for the test key's sends (the simulator answers for them): nothing listens
        # on their port, and no live notification is ever sent to them
        closed = free_port()
        must("POST", "/api/v1/providers", {
            "name": "mail", "channel": "email", "kind": "smtp", "max_attempts": 2, "secrets": {},
            "config": {"host": "127.0.0.1", "port": closed, "from_email": "noreply@soak.test"}})  # fmt: skip
        must("POST", "/api/v1/providers", {
            "name": "text", "channel": "sms", "kind": "twilio", "max_attempts": 2,
            "config": {"account_sid": "AC" + "0123456789abcdef" * 2, "from_number": "+15005550006",
                       "base_url": f"http://127.0.0.1:{closed}/"},
            "secrets": {"auth_token": "auth-token-0123456789abcdef"}})  # fmt: skip
        must("POST", "/api/v1/templates", {"key": BULK_TEMPLATE, "channel": "webhook", "subject": "bulk",
                                            "body": "bulk row"})
        must("POST", "/api/v1/categories", {"key": "news"})
        for i in range(SUBSCRIBERS):
            prefs = {"news": {"push": i % 4 != 0, "in_app": i % 5 != 0}}
            must("PUT", f"/api/v1/subscribers/sub-{i}", {"push_tokens": [f"tok-{i}"], "preferences": prefs})
        for i in FCM_DEVICES:
            must("POST", f"/api/v1/subscribers/sub-{i}/devices", {"kind": "fcm", "token": f"fcm-token-{i}"})
        for i in APNS_DEVICES:
            must("POST", f"/api/v1/subscribers/sub-{i}/devices", {"kind": "apns", "token": f"{i:064x}"})
        for i in WEBPUSH_DEVICES:
            subscription = self.webpush.subscribe(f"sub-{i}").as_json()
            must("POST", f"/api/v1/subscribers/sub-{i}/devices", {"kind": "webpush", "subscription": subscription})
        must("POST", "/api/v1/workflows", {"key": WORKFLOW, "name": "soak", "steps": WORKFLOW_STEPS})
        # the topic: its members get a push token each (the workflow's push step), then join in pages
        members = [f"topic-{i}" for i in range(self.config.topic_members)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda m: must("PUT", f"/api/v1/subscribers/{m}", {"push_tokens": [f"tok-{m}"]}), members))
        must("PUT", f"/api/v1/topics/{TOPIC}", {"name": "soak"})
        for page in range(0, len(members), 1000):
            must("POST", f"/api/v1/topics/{TOPIC}/subscribers", {"subscribers": members[page : page + 1000]})
        self.topic_members = set(members)
        must("POST", "/api/v1/event-endpoints", {"name": "soak", "url": self.receiver.events_url,
                                                  "event_types": ["notification.delivered"], "secret": EVENTS_SECRET})

    def _start_processes(self, env: dict[str, str], logs: Path) -> None:
        python = sys.executable
        for i, port in enumerate(self.web_ports):
            self.procs[f"web{i}"] = Supervised(
                f"web{i}", [python, "-m", "gunicorn", "omnipost_site.wsgi:application", "--workers", "1",
                            "--worker-class", "gthread", "--threads", "4", "--bind", f"127.0.0.1:{port}",
                            "--graceful-timeout", "3", "--log-level", "warning"],
                {**env, "OMNIPOST_APP_NAME": "omnipost-web"}, logs / f"web{i}.log",
                answers_http(f"http://127.0.0.1:{port}/healthz"),
            )  # fmt: skip
        for i in range(self.config.dispatchers):
            self.procs[f"dispatcher{i}"] = Supervised(
                f"dispatcher{i}", [python, "manage.py", "run_dispatcher", "--no-jitter", "--concurrency", "32",
                                   "--batch-size", "32", "--grace-seconds", "3"],
                {**env, "OMNIPOST_APP_NAME": "omnipost-dispatcher", "OMNIPOST_LOG_LEVEL": "INFO"},
                logs / f"dispatcher{i}.log",
                logged("started (concurrency"),
            )  # fmt: skip
        self.procs["scheduler"] = Supervised(
            "scheduler", [python, "manage.py", "run_scheduler", "--no-jitter", "--interval", "0.5"],
            {**env, "OMNIPOST_APP_NAME": "omnipost-scheduler"}, logs / "scheduler.log", running,
        )  # fmt: skip
        bounce_port = free_port()
        self.procs["bounce_listener"] = Supervised(
            "bounce_listener", [python, "manage.py", "run_bounce_listener", "--bind", f"127.0.0.1:{bounce_port}"],
            {**env, "OMNIPOST_APP_NAME": "omnipost-bounces"}, logs / "bounce_listener.log", accepts_tcp(bounce_port),
        )  # fmt: skip
        for proc in self.procs.values():
            proc.start()

    def leased(self) -> list[str]:
        """Notifications leased now (claimed, not yet recorded): what a killed or stopped dispatcher
        may have sent without recording. Read right after the kill, so it holds every lease the
        victim took (nobody releases them until they expire)."""
        import psycopg

        deadline = time.time() + 15
        while True:
            try:
                with psycopg.connect(self.pg.dsn(DBNAME), autocommit=True, connect_timeout=3) as conn:
                    rows = conn.execute("SELECT notification_id::text FROM queue_state "
                                        "WHERE lock_token IS NOT NULL AND locked_until > now()").fetchall()  # fmt: skip
                return [row[0] for row in rows]
            except psycopg.Error:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)

    def inbox_arrivals(self, since: float = 0.0) -> list[tuple[str, float]]:
        """In-app deliveries written at or after `since` (unix time): (notification id, when the record
        statement wrote its feed item); none while the server is down (a fault)."""
        import psycopg

        try:
            with psycopg.connect(self.pg.dsn(DBNAME), autocommit=True, connect_timeout=3) as conn:
                sql = ("SELECT notification_id::text, extract(epoch FROM created_at)::float8 FROM inbox_items"
                       " WHERE created_at >= to_timestamp(%s)")
                return conn.execute(sql, [since]).fetchall()
        except psycopg.Error:
            return []

    def push_arrivals(self) -> list[tuple[str, float]]:
        """What the native push vendors accepted: (notification id, when), duplicates included; an FCM
        message whose create was never acknowledged (yet) goes by its `soak_ref`."""
        refs = self.load.refs
        return [*((refs.get(ref, ref), at) for ref, at in [*self.fcm.arrivals(), *self.webpush.arrivals()]),
                *self.apns.arrivals()]

    def workflow_runs(self, made: bool = False) -> list[dict[str, Any]] | None:
        """Every workflow run as the database holds it: {id, trigger_id, status, sends: [(step, notification
        id or None, its status)]}, and with `made` the notifications each send step made (by their
        metadata's `workflow_run_id` and `step`: one each, or a step ran twice) as `made: {step: n}`;
        None while the server is down (a fault)."""
        import psycopg

        counts: dict[tuple[str, str], int] = {}
        try:
            with psycopg.connect(self.pg.dsn(DBNAME), autocommit=True, connect_timeout=3) as conn:
                runs = conn.execute("SELECT id::text, trigger_id::text, status, steps, subscriber "
                                    "FROM workflow_runs").fetchall()  # fmt: skip
                ids = [s["notification_id"] for *_, steps, _ in runs for s in steps if s.get("notification_id")]
                statuses = dict(conn.execute("SELECT id::text, status FROM notifications WHERE id = ANY(%s::uuid[])",
                                             [ids]).fetchall())  # fmt: skip
                if made:
                    sql = ("SELECT metadata->>'workflow_run_id', metadata->>'step', count(*) FROM notifications "
                           "WHERE metadata ? 'workflow_run_id' GROUP BY 1, 2")
                    counts = {(run_id, step): n for run_id, step, n in conn.execute(sql).fetchall()}
        except psycopg.Error:
            return None
        return [{"id": run_id, "trigger_id": trigger_id, "status": status, "subscriber": subscriber,
                 "sends": [(s["name"], s.get("notification_id"), statuses.get(s.get("notification_id")))
                           for s in steps if s.get("type") == "send"],
                 **({"made": {s["name"]: counts.get((run_id, s["name"]), 0) for s in steps
                              if s.get("type") == "send"}} if made else {})}
                for run_id, trigger_id, status, steps, subscriber in runs]  # fmt: skip

    def _take_workflow_sends(self, runs: list[dict[str, Any]]) -> None:
        """The send steps' notifications of acknowledged triggers' runs join the ledger's `sent`."""
        providers = {s["name"]: s.get("provider") or ("inbox" if s["channel"] == "in_app" else "")
                     for s in WORKFLOW_STEPS if s["type"] == "send"}  # fmt: skip
        for run in runs:
            acked = self.load.triggers.get(run["trigger_id"])
            if acked is None:
                continue
            for step, notification_id, status in run["sends"]:
                if notification_id and notification_id not in self.load.sent:
                    stored = "suppressed" if status == "suppressed" else "queued"
                    self.load.sent[notification_id] = Sent("workflow", acked, acked, stored, providers.get(step, ""))

    def busy(self, within: float = 3.0) -> None:
        """Wait (up to `within` seconds) until some notification is leased, so that a kill or stop of a
        dispatcher comes while sends are in flight, as a crash or a deploy in production would."""
        deadline = time.time() + within
        while time.time() < deadline and not self.leased():
            time.sleep(0.05)

    def _sample(self) -> None:
        while not self.sampling.wait(self.sample_every):
            now = time.time()
            for proc in self.procs.values():
                pid = proc.pid
                if pid is None or not proc.incarnations:
                    continue
                reading = rss_and_files(pid)
                if reading is not None and reading[0] > 0 and proc.incarnations[-1].pid == pid:  # 0: exiting
                    proc.incarnations[-1].samples.append((now, *reading))

    # the whole run -----------------------------------------------------------------------------
    def run(self) -> Report:
        import tempfile

        config = self.config
        say = config.progress
        workdir = config.workdir or Path(tempfile.mkdtemp(prefix="omnipost-soak-"))
        workdir.mkdir(parents=True, exist_ok=True)
        began = time.time()
        receiver = None
        feed: list[tuple[str, float]] = []  # in-app arrivals, read before the server stops
        try:
            self._start_servers()
            env = self._env()
            say("schema")
            if config.prepare is not None:
                config.prepare(self.pg.dsn(DBNAME))
            else:  # straight to the primary
                direct = {k: v for k, v in env.items() if k not in ("OMNIPOST_DATABASE_POOLER",
                                                                    "OMNIPOST_LISTEN_DATABASE_URL")}
                self._manage("migrate", "--no-input", "-v", "0", env={**direct, "DATABASE_URL": self.pg.url(DBNAME)})
            self.receiver = receiver = ChaosReceiver(workdir / "receiver.log", provider_secret=PROVIDER_SECRET,
                                                     events_secret=EVENTS_SECRET,
                                                     delay_ms=config.provider_delay_ms)  # fmt: skip
            self.fcm = SoakFcm(config.provider_delay_ms / 1000).start()
            (workdir / "apns-tls").mkdir(exist_ok=True)
            self.apns = SoakApns(config.provider_delay_ms / 1000, workdir / "apns-tls").start()
            self.webpush = SoakWebPush(config.provider_delay_ms / 1000).start()
            self.web_ports = [free_port() for _ in range(config.webs)]
            env["OMNIPOST_PUBLIC_URL"] = f"http://127.0.0.1:{self.web_ports[0]}"
            self._start_processes(env, workdir)
            say("processes starting")
            self._setup_tenant(env)
            deadline = time.time() + 90
            while not all(proc.up_at for proc in self.procs.values()):
                if time.time() > deadline:
                    raise RuntimeError(f"not up: {[n for n, p in self.procs.items() if not p.up_at]}")
                time.sleep(0.2)
            setup_seconds = time.time() - began
            say(f"set up in {setup_seconds:.1f} s; load at {config.rate:g}/s for {config.seconds:g} s")

            self.sampling = threading.Event()
            self.sample_every = 1.0 if config.quick else 5.0
            sampler = threading.Thread(target=self._sample, daemon=True)
            sampler.start()
            self.load = Load(self.api, config, random.Random(config.seed + 1), self.test_api)  # noqa: S311
            self.occasional = Occasional(self)
            self.receipts = Receipts(self, random.Random(config.seed + 2))  # noqa: S311
            faults = Faults(self, random.Random(config.seed + 3))  # noqa: S311
            load_started = time.time()
            self.load.start()
            self.occasional.start()
            self.receipts.start()
            faults.start()
            self._run_for(load_started + config.seconds, faults)
            if config.seconds / config.fault_every >= len(config.kinds):
                # a run long enough for every kind has each of them, even if injecting ran late: the load
                # goes on until the first round of the bag is through (bounded)
                self._run_for(time.time() + config.fault_every * (len(config.kinds) + 1), faults,
                              done=lambda: len(faults.done) >= len(config.kinds))  # fmt: skip
            # and on until the last fault has ended and what was created after it could arrive, so that
            # its recovery is measured even when a restart on a loaded machine ends it late (bounded)
            faults.stop_injecting()
            self._run_for(time.time() + config.fault_every * 2 + 15, faults,
                          done=lambda: faults.settled(RECOVERED_PICKUP + 3))  # fmt: skip
            self.load.stop()
            load_ended = time.time()
            self.occasional.stop(config.drain_seconds)
            faults.stop()
            for target in ("provider", "events"):
                receiver.mode(target, "ok")
            for vendor in (self.fcm, self.apns, self.webpush):
                vendor.set_mode("ok")
            say(f"load stopped ({len(self.load.sent)} acknowledged); draining")
            drained = self._drain(load_ended + config.drain_seconds)
            self.receipts.stop()
            say(f"drained: {drained}; reading the API")
            self.workflow_view = self.workflow_runs(made=True) or []
            self._take_workflow_sends(self.workflow_view)
            api_view = self._api_view()
            self.test_view = self._test_view(time.time() + (30 if config.quick else 90))
            feed = self.inbox_arrivals()
            self._timeouts_of_duplicates(api_view, faults)
            alive = {name: proc.alive() for name, proc in self.procs.items()}
            self.sampling.set()
            sampler.join(10)
        finally:
            for proc in self.procs.values():
                proc.stop()
            final, accepted = receiver.stop() if receiver is not None else ({}, [])
            pushed = self.push_arrivals() if hasattr(self, "load") else []
            self.push_refused = []  # requests the vendors would refuse as malformed
            for name in NATIVE_PUSH:
                if hasattr(self, name):
                    vendor = getattr(self, name)
                    self.push_refused += [f"{name}: {why}" for why in vendor.refused]
                    vendor.stop()
            accepted = [*accepted, *(("provider", "", i, at) for i, at in [*feed, *pushed])]
            if hasattr(self, "api"):
                self.api.close()
                self.test_api.close()
            self._stop_servers()
        return build_report(config, self, faults, final, accepted, api_view, alive, drained,
                            {"setup_seconds": round(setup_seconds, 1), "load_started": load_started,
                             "load_ended": load_ended, "workdir": str(workdir)})  # fmt: skip

    def _run_for(self, until: float, faults: Faults, done: Callable[[], bool] = lambda: False) -> None:
        """Let the load and the faults run until `until` (or `done()`), saying how far they got every 30 s."""
        said = time.time()
        while (now := time.time()) < until and not done():
            time.sleep(min(1.0, until - now))
            if now - said >= 30:
                said = now
                sent, arrived = len(self.load.sent), len(self.receipts.arrived)
                self.config.progress(f"{sent:,} acknowledged, {arrived:,} delivered, {len(faults.done)} faults")

    def _drain(self, deadline: float) -> bool:
        """Until every acknowledged workflow trigger has its runs and each has finished, and every
        acknowledged notification (a run's send steps' too) that is not suppressed has arrived at the
        provider, the native push vendor or the feed, and an event of it at the endpoint (or the deadline)."""
        events_seen: set[str] = set()
        index = 0
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                self.receipts.follow()
                rows = self.receiver.accepted_since("events", index)
                index += len(rows)
                events_seen.update(row[1] for row in rows)
            runs = self.workflow_runs()
            if runs is None:
                time.sleep(0.5)
                continue
            self._take_workflow_sends(runs)
            runs_done = set(self.load.triggers) <= {r["trigger_id"] for r in runs} and all(
                r["status"] not in ("running", "waiting") for r in runs)  # fmt: skip
            wanted = {i for i, s in self.load.sent.items() if s.status != "suppressed"}
            if runs_done and wanted <= set(self.receipts.arrived) and wanted <= events_seen:
                return True
            time.sleep(0.5)
        return False

    def _timeouts_of_duplicates(self, api_view: dict[str, dict[str, Any]], faults: Faults) -> None:
        """For each notification the provider took more than once outside every kill's in-flight set:
        how many of its attempts timed out (`timeouts` in its `api_view` row, from the API's detail).
        A send whose reply missed the provider timeout may have been accepted all the same; its retry
        then delivers it again, at least once as promised (the webhook id lets a receiver drop it)."""
        hits = Counter(row[1] for row in self.receiver.accepted_since("provider", 0))
        hits.update(i for i, _ in self.push_arrivals())
        in_flight = set().union(*(set(f.in_flight or ()) for f in faults.done))
        deadline = time.time() + 60
        for notification_id in sorted(i for i, n in hits.items() if n > 1 and i not in in_flight):
            response, _ = self.api.until_ok("GET", f"/api/v1/notifications/{notification_id}", deadline)
            if response is not None and response.status_code == 200 and notification_id in api_view:
                attempts = response.json().get("attempts", [])
                api_view[notification_id]["timeouts"] = sum(a.get("error_code") == "timeout" for a in attempts)

    def _test_view(self, deadline: float) -> dict[str, dict[str, Any]]:
        """The test key's notifications as it lists them, once each of the load's has its final status and
        the receipt it awaits (or at `deadline`)."""
        while True:
            view = self._api_view(self.test_api)
            done = all(view.get(i, {}).get("status") in TEST_FINAL and (receipt is None or view[i]["receipt"])
                       for i, (*_, receipt) in self.load.tests.items())  # fmt: skip
            if done or time.time() > deadline:
                return view
            time.sleep(1.0)

    def _api_view(self, api: Api | None = None) -> dict[str, dict[str, Any]]:
        """Every notification as the API lists it (to the live key, or `api`'s): id → {status, receipt}."""
        found: dict[str, dict[str, Any]] = {}
        url: str | None = "/api/v1/notifications?limit=500"
        deadline = time.time() + 300
        while url:
            response, _ = (api or self.api).until_ok("GET", url, deadline)
            if response is None or response.status_code != 200:
                raise RuntimeError(f"listing notifications: {response and response.status_code}")
            page = response.json()
            for row in page["results"]:
                found[row["id"]] = {"status": row["status"], "receipt": row.get("receipt")}
            url = page.get("next")
        return found


# --- the ledger and the report -----------------------------------------------------------------
@dataclass
class Report:
    config: dict[str, Any]
    ledger: dict[str, Any]
    faults: list[dict[str, Any]]
    processes: dict[str, dict[str, Any]]
    timeline: dict[str, list]
    load: dict[str, Any]
    failures: list[str]
    meta: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


GROWTH_MIN_SECONDS = 120.0  # incarnations sampled at least this long are checked for growth
GROWTH_MAX_RSS_MB = 100.0
GROWTH_MAX_FILES = 50


def growth(samples: list[tuple[float, int, int]]) -> dict[str, float]:
    """RSS (MB) and open files from the second quarter of an incarnation's samples (past its warm-up)
    to the last quarter, medians of each; empty for one sampled shorter than GROWTH_MIN_SECONDS."""
    if len(samples) < 8 or samples[-1][0] - samples[0][0] < GROWTH_MIN_SECONDS:
        return {}
    quarter = len(samples) // 4
    early, late = samples[quarter : 2 * quarter], samples[-quarter:]
    return {"rss_growth_mb": round((statistics.median(s[1] for s in late) - statistics.median(s[1] for s in early))
                                   / 2**20, 1),
            "files_growth": statistics.median(s[2] for s in late) - statistics.median(s[2] for s in early)}  # fmt: skip


def build_report(config: SoakConfig, soak: Soak, faults: Faults, final: dict, accepted: list, api_view: dict,
                 alive: dict[str, bool], drained: bool, meta: dict[str, Any]) -> Report:  # fmt: skip
    sent = soak.load.sent
    provider_hits: dict[str, list[float]] = defaultdict(list)
    event_hits: dict[str, int] = Counter()
    event_times: list[float] = []
    for target, _webhook_id, notification_id, at in accepted:
        if target == "provider":
            provider_hits[notification_id].append(at)
        else:
            event_hits[notification_id] += 1
            event_times.append(at)
    expected = {i for i, s in sent.items() if s.status != "suppressed"}
    suppressed = {i for i, s in sent.items() if s.status == "suppressed"}
    delivered = expected & set(provider_hits)
    lost = sorted(expected - set(provider_hits))
    suppressed_sent = sorted(suppressed & set(provider_hits))
    unacknowledged_arrivals = sorted(set(provider_hits) - set(sent))
    duplicates = {i: len(times) - 1 for i, times in provider_hits.items() if len(times) > 1}

    kills = [f for f in faults.done if f.in_flight is not None]
    in_flight_union = set().union(*(set(f.in_flight or ()) for f in kills)) if kills else set()
    outside = set(duplicates) - in_flight_union
    # a duplicate after timed-out sends: no more copies than timeouts (each may have been accepted late)
    after_timeout = {i for i in outside if duplicates[i] <= api_view.get(i, {}).get("timeouts", 0)}
    unexplained_dups = sorted(outside - after_timeout)
    per_kill = []
    for f in kills:
        mine = set(duplicates) & set(f.in_flight or ())
        per_kill.append({"kind": f.kind, "target": f.target, "at": round(f.started - meta["load_started"], 1),
                         "in_flight": len(f.in_flight or ()),
                         "duplicates": sum(duplicates[i] for i in mine)})  # fmt: skip

    api_delivered = {i for i, row in api_view.items() if row["status"] == "delivered"}
    api_mismatch = sorted((delivered ^ (api_delivered & set(sent))) - set(lost))
    not_suppressed_by_api = sorted(i for i in suppressed if api_view.get(i, {}).get("status") != "suppressed")
    opted_out = {i for i, s in sent.items()
                 if s.kind in ("subscriber", "inbox", *NATIVE_PUSH) and s.status == "suppressed"}  # fmt: skip
    missing_events = sorted(i for i in api_delivered & set(sent) if not event_hits.get(i))
    receipts_posted = soak.receipts.posted
    receipts_missing = sorted(i for i in receipts_posted if not api_view.get(i, {}).get("receipt"))
    status_counts = Counter(row["status"] for i, row in api_view.items() if i in sent)

    # recovery: from a fault's end to the first arrival of a notification due after it that took
    # at most RECOVERED_PICKUP (the backlog the fault made is behind it). A scheduler's kill: of a
    # future-dated one (what only the scheduler moves); the event endpoint's outage: any event. A
    # notification can arrive a moment before its creator reads the 201: those count from the 201.
    # A workflow's send steps are not in these figures: they are due when the scheduler reaches them.
    timed = {i: s for i, s in sent.items() if s.kind != "workflow"}
    prompt = [(s.due_at, max(min(provider_hits[i]), s.due_at), s.kind) for i, s in timed.items()
              if i in provider_hits and min(provider_hits[i]) - s.due_at <= RECOVERED_PICKUP]  # fmt: skip
    event_times.sort()
    for f in faults.done:
        if f.ended is None:
            continue
        if f.kind == "events_down":
            later = [at for at in event_times if at >= f.ended][:1]
        else:
            wanted = (("future",) if f.kind == "scheduler_kill"
                      else ("single", "batch", "future", "subscriber", "inbox", *NATIVE_PUSH))  # fmt: skip
            later = [arrived for due, arrived, kind in prompt if due >= f.ended and kind in wanted]
        f.recovered_after = round(min(later) - f.ended, 2) if later else None

    processes = {}
    for name, proc in soak.procs.items():
        incarnations = []
        for inc in proc.incarnations:
            samples = inc.samples
            rss = [s[1] for s in samples]
            files = [s[2] for s in samples]
            incarnations.append({
                "pid": inc.pid, "exit": inc.code, "seconds": round((inc.ended or time.time()) - inc.started, 1),
                "rss_mb_first": round(rss[0] / 2**20, 1) if rss else None,
                "rss_mb_last": round(rss[-1] / 2**20, 1) if rss else None,
                "rss_mb_max": round(max(rss) / 2**20, 1) if rss else None,
                "files_first": files[0] if files else None, "files_last": files[-1] if files else None,
                "files_max": max(files) if files else None, **growth(samples),
            })  # fmt: skip
        killed = sum(1 for f in faults.done if f.kind in ("kill9", "scheduler_kill") and f.target == name)
        processes[name] = {"alive_at_end": alive.get(name, False), "starts": len(proc.incarnations),
                           "killed_by_soak": killed, "unexplained_exits": len(proc.incarnations) - 1 - killed,
                           "incarnations": incarnations,
                           "samples": [(round(t - meta["load_started"], 1), round(r / 2**20, 1), n)
                                       for inc in proc.incarnations for t, r, n in inc.samples]}  # fmt: skip

    # timeline: per bucket of seconds since the load started
    bucket = 1.0 if config.quick else 5.0
    start = meta["load_started"]
    arrivals = Counter(int((min(t) - start) // bucket) for i, t in provider_hits.items() if i in sent)
    pickups: dict[int, list[float]] = defaultdict(list)
    for i, s in timed.items():
        if i in provider_hits:
            pickups[int((s.due_at - start) // bucket)].append(min(provider_hits[i]) - s.due_at)
    last = max([*arrivals, *pickups, 0]) + 1
    timeline = {
        "bucket_seconds": [bucket],
        "t": [round(b * bucket, 1) for b in range(last)],
        "delivered_per_second": [round(arrivals.get(b, 0) / bucket, 1) for b in range(last)],
        "pickup_p99_ms": [round(p * 1000, 1) if (p := _percentile(pickups.get(b, []), 0.99)) is not None else None
                          for b in range(last)],  # fmt: skip
    }
    all_pickups = [min(provider_hits[i]) - s.due_at for i, s in timed.items() if i in provider_hits]

    # workflows: every acknowledged trigger has its run, every run completed with each send step's
    # notification made (whose arrival, exactly once, the checks above hold like any other's)
    triggers = getattr(soak.load, "triggers", {})
    runs = [r for r in getattr(soak, "workflow_view", []) if r["trigger_id"] in triggers]
    triggers_without_runs = sorted(set(triggers) - {r["trigger_id"] for r in runs})
    runs_not_completed = sorted(f"{r['id']} {r['status']}" for r in runs if r["status"] != "completed")
    sends_without_notification = sorted(f"{r['id']} {step}" for r in runs if r["status"] == "completed"
                                        for step, notification_id, _ in r["sends"] if not notification_id)  # fmt: skip
    steps_made_twice = sorted(f"{r['id']} {step} ×{n}" for r in runs for step, n in r.get("made", {}).items() if n > 1)

    # test mode: each test notification ends as its simulator address implies (with its receipt), none
    # reached a provider's stand-in, the chaos receiver or a feed, and the live key lists none of them
    tests = getattr(soak.load, "tests", {})
    test_view = getattr(soak, "test_view", {})
    test_wrong = sorted(f"{i} {channel} {recipient}: {test_view.get(i, {}).get('status')}/"
                        f"{test_view.get(i, {}).get('receipt')}, not {status}/{receipt}"
                        for i, (channel, recipient, status, receipt) in tests.items()
                        if test_view.get(i, {}).get("status") != status
                        or (receipt is not None and test_view[i].get("receipt") != receipt))  # fmt: skip
    test_arrived = sorted(set(tests) & set(provider_hits))
    test_listed_live = sorted(set(tests) & set(api_view))
    live_listed_to_test = sorted(set(sent) & set(test_view))  # and the test key lists no live one
    # topic triggers: one run per member of the topic per trigger (all completed: the workflow checks)
    occasional = getattr(soak, "occasional", None)
    topic_triggers = occasional.topic_triggers if occasional is not None else {}
    members = getattr(soak, "topic_members", set())
    topic_runs = [r for r in runs if r["trigger_id"] in topic_triggers]
    topic_wrong = []
    for trigger_id, announced in topic_triggers.items():
        subscribers = Counter(r["subscriber"] for r in topic_runs if r["trigger_id"] == trigger_id)
        if announced != len(members) or set(subscribers) != members or max(subscribers.values(), default=0) > 1:
            topic_wrong.append(f"{trigger_id}: {announced} runs announced, {subscribers.total()} made for "
                               f"{len(subscribers)} of the {len(members)} members")  # fmt: skip
    # the bulk send: completed, each row exactly one notification, every one delivered
    bulk = occasional.bulk if occasional is not None else {}
    bulk_ids = {i for i, s in sent.items() if s.kind == "bulk"}
    bulk_rows = sorted(bulk.get("rows_seen", []))

    failures = []
    if occasional is not None and occasional.errors:
        failures.append(f"topic triggers or the bulk send failed: {occasional.errors[:3]}")
    if test_wrong:
        failures.append(f"{len(test_wrong)} test notifications not as the simulator's address implies, "
                        f"e.g. {test_wrong[:3]}")  # fmt: skip
    if test_arrived:
        failures.append(f"{len(test_arrived)} test notifications reached a provider or a feed, e.g. {test_arrived[:3]}")
    if test_listed_live:
        failures.append(f"{len(test_listed_live)} test notifications listed to the live key, "
                        f"e.g. {test_listed_live[:3]}")  # fmt: skip
    if live_listed_to_test:
        failures.append(f"{len(live_listed_to_test)} live notifications listed to the test key, "
                        f"e.g. {live_listed_to_test[:3]}")  # fmt: skip
    if occasional is not None and len(topic_triggers) != config.topic_triggers:
        failures.append(f"{len(topic_triggers)} of {config.topic_triggers} topic triggers acknowledged")
    if topic_wrong:
        failures.append(f"topic triggers without exactly one run per member: {topic_wrong[:3]}")
    if occasional is not None and bulk.get("status") != "completed":
        failures.append(f"the bulk send ended {bulk.get('status')!r}, not completed")
    if occasional is not None and bulk_rows != list(range(1, BULK_ROWS + 1)):
        failures.append(f"the bulk send's {BULK_ROWS} rows made {len(bulk_rows)} notifications for "
                        f"{len(set(bulk_rows))} distinct rows")  # fmt: skip
    if lost:
        failures.append(f"{len(lost)} acknowledged notifications never reached the provider, e.g. {lost[:3]}")
    if unexplained_dups:
        failures.append(f"{len(unexplained_dups)} duplicates outside any kill's in-flight set or timeout, e.g. "
                        f"{unexplained_dups[:3]}")  # fmt: skip
    for kill in per_kill:
        if kill["duplicates"] > kill["in_flight"]:
            failures.append(f"{kill['kind']} of {kill['target']}: {kill['duplicates']} duplicates, "
                            f"{kill['in_flight']} in flight")  # fmt: skip
    if missing_events:
        failures.append(f"{len(missing_events)} delivered notifications without their event, e.g. {missing_events[:3]}")
    if suppressed_sent:
        failures.append(f"{len(suppressed_sent)} suppressed notifications reached the provider")
    if not_suppressed_by_api:
        failures.append(f"{len(not_suppressed_by_api)} acknowledged as suppressed but not so in the API")
    if api_mismatch:
        failures.append(f"{len(api_mismatch)} where the API and the provider disagree on delivery, "
                        f"e.g. {api_mismatch[:3]}")  # fmt: skip
    if soak.receipts.failed:
        failures.append(f"{len(soak.receipts.failed)} receipts not acknowledged: {soak.receipts.failed[:2]}")
    if receipts_missing:
        failures.append(f"{len(receipts_missing)} acknowledged receipts not shown, e.g. {receipts_missing[:3]}")
    for name, proc in processes.items():
        for inc in proc["incarnations"]:
            if inc.get("rss_growth_mb", 0) > GROWTH_MAX_RSS_MB or inc.get("files_growth", 0) > GROWTH_MAX_FILES:
                failures.append(f"{name} (pid {inc['pid']}) grew: RSS {inc['rss_growth_mb']:+} MB, "
                                f"open files {inc['files_growth']:+}")  # fmt: skip
    dead = [name for name, ok in alive.items() if not ok]
    if dead:
        failures.append(f"not alive at the end: {dead}")
    if triggers_without_runs:
        failures.append(f"{len(triggers_without_runs)} acknowledged workflow triggers without a run, "
                        f"e.g. {triggers_without_runs[:3]}")  # fmt: skip
    if runs_not_completed:
        failures.append(f"{len(runs_not_completed)} workflow runs not completed, e.g. {runs_not_completed[:3]}")
    if steps_made_twice:
        failures.append(f"{len(steps_made_twice)} workflow send steps made more than one notification, "
                        f"e.g. {steps_made_twice[:3]}")  # fmt: skip
    if sends_without_notification:
        failures.append(f"{len(sends_without_notification)} completed runs' send steps without a notification, "
                        f"e.g. {sends_without_notification[:3]}")  # fmt: skip
    push_refused = getattr(soak, "push_refused", [])
    if push_refused:
        failures.append(f"{len(push_refused)} requests a push vendor's stand-in refused as malformed: "
                        f"{push_refused[:3]}")  # fmt: skip
    if soak.load.unacknowledged:
        failures.append(f"{soak.load.unacknowledged} creates not acknowledged within 30 s of retries")
    if faults.errors:
        failures.append(f"faults not injected: {faults.errors[:3]}")
    missing_kinds = sorted(set(config.kinds) - {f.kind for f in faults.done})
    if not sent:
        failures.append("nothing was acknowledged")

    ledger = {
        "acknowledged": len(sent), "acknowledged_by_kind": dict(Counter(s.kind for s in sent.values())),
        "expected_deliveries": len(expected), "delivered": len(delivered),
        "delivered_by_kind": dict(Counter(sent[i].kind for i in delivered)), "suppressed": len(suppressed),
        "opted_out_suppressed": len(opted_out), "lost": len(lost), "lost_ids": lost[:20],
        "duplicates": sum(duplicates.values()), "duplicate_notifications": len(duplicates),
        "duplicates_outside_in_flight": len(unexplained_dups),
        "duplicates_after_timeout": sum(duplicates[i] for i in after_timeout), "kills": per_kill,
        "events_delivered": sum(1 for i in api_delivered & set(sent) if event_hits.get(i)),
        "events_missing": len(missing_events),
        "event_duplicates": sum(n - 1 for n in event_hits.values() if n > 1),
        "receipts_acknowledged": sum(receipts_posted.values()), "receipt_notifications": len(receipts_posted),
        "receipts_missing": len(receipts_missing), "receipts_failed": len(soak.receipts.failed),
        "push_arrivals": len(delivered & {i for i, s in sent.items() if s.kind in NATIVE_PUSH}),
        "push_duplicates": sum(duplicates.get(i, 0) for i, s in sent.items() if s.kind in NATIVE_PUSH),
        "push_refused": len(push_refused),
        "workflow_triggers": len(triggers), "workflow_runs": len(runs),
        "workflow_runs_by_status": dict(Counter(r["status"] for r in runs)),
        "workflow_runs_completed": sum(r["status"] == "completed" for r in runs),
        "workflow_triggers_without_runs": len(triggers_without_runs),
        "workflow_runs_not_completed": len(runs_not_completed), "workflow_steps_made_twice": len(steps_made_twice),
        "workflow_notifications": sum(s.kind == "workflow" for s in sent.values()),
        "workflow_notifications_delivered": sum(sent[i].kind == "workflow" for i in delivered),
        "test_notifications": len(tests),
        "test_by_expected": dict(Counter(f"{c} {s}" for c, _, s, _ in tests.values())),
        "test_by_status": dict(Counter(test_view.get(i, {}).get("status") for i in tests)),
        "test_receipts": dict(Counter(test_view[i]["receipt"] for i in tests if test_view.get(i, {}).get("receipt"))),
        "test_not_as_expected": len(test_wrong), "test_arrived": len(test_arrived),
        "test_listed_live": len(test_listed_live), "live_listed_to_test": len(live_listed_to_test),
        "topic_members": len(members), "topic_triggers": len(topic_triggers),
        "topic_runs": len(topic_runs), "topic_runs_completed": sum(r["status"] == "completed" for r in topic_runs),
        "topic_wrong": len(topic_wrong),
        "bulk_status": bulk.get("status"), "bulk_rows": bulk.get("rows"), "bulk_notifications": len(bulk_rows),
        "bulk_distinct_rows": len(set(bulk_rows)), "bulk_delivered": len(delivered & bulk_ids),
        "bulk_duplicates": sum(duplicates.get(i, 0) for i in bulk_ids),
        "api_statuses": dict(status_counts), "api_provider_mismatch": len(api_mismatch),
        "arrivals_not_acknowledged": len(unacknowledged_arrivals),
        "suppressed_but_sent": len(suppressed_sent), "drained": drained,
        "pickup_ms": {q: round(p * 1000, 1) if (p := _percentile(all_pickups, v)) is not None else None
                      for q, v in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},  # fmt: skip
        "faults_by_kind": dict(Counter(f.kind for f in faults.done)), "fault_kinds_missing": missing_kinds,
        "processes_alive": sum(alive.values()), "processes": len(alive),
        "restarts": sum(p["starts"] - 1 for p in processes.values()),
        "unexplained_exits": sum(max(0, p["unexplained_exits"]) for p in processes.values()),
    }  # fmt: skip
    load_seconds = meta["load_ended"] - meta["load_started"]
    load = {"offered": soak.load.offered, "shed": soak.load.shed, "answers": dict(soak.load.answers),
            "retried_requests": soak.load.retried, "odd": soak.load.odd[:10],
            "acknowledged_per_second": round(len(sent) / load_seconds, 1) if load_seconds else None,
            "receiver": final}  # fmt: skip
    fault_rows = [{"kind": f.kind, "at": round(f.started - start, 1),
                   "seconds": round(f.ended - f.started, 1) if f.ended else None, "target": f.target,
                   "detail": f.detail.strip(), "in_flight": len(f.in_flight) if f.in_flight is not None else None,
                   "recovered_after": f.recovered_after} for f in faults.done]  # fmt: skip
    cfg = {"seconds": config.seconds, "rate": config.rate, "fault_every": config.fault_every, "seed": config.seed,
           "kinds": list(config.kinds), "quick": config.quick, "dispatchers": config.dispatchers, "webs": config.webs,
           "lease_seconds": config.lease_seconds, "provider_delay_ms": config.provider_delay_ms,
           "circuit_open_seconds": config.circuit_open_seconds, "pooled": config.pooled,
           "standby": config.standby}  # fmt: skip
    return Report(cfg, ledger, fault_rows, processes, timeline, load, failures,
                  {**meta, "machine": f"{os.cpu_count()} CPUs"})  # fmt: skip


def markdown(report: Report) -> str:
    led, cfg = report.ledger, report.config
    lines = [
        f"# Chaos soak: {cfg['seconds']:g} s at {cfg['rate']:g}/s, a fault every {cfg['fault_every']:g} s "
        f"(seed {cfg['seed']})", "",
        f"**{'PASS' if report.ok else 'FAIL'}**" + ("" if report.ok else ": " + "; ".join(report.failures)), "",
        f"{cfg['webs']} web, {cfg['dispatchers']} dispatchers, a scheduler and the bounce listener on a private "
        "PostgreSQL server"
        + (" with a synchronous streaming standby (a failover promotes it; a new one is rebuilt from the new "
           "primary)" if cfg.get("standby") else "")
        + (", through PgBouncer (transaction pooling)" if cfg.get("pooled") else "")
        + f"; the provider answers in {cfg['provider_delay_ms']:g} ms; "
        f"lease {cfg['lease_seconds']:g} s; breakers open {cfg['circuit_open_seconds']:g} s; "
        f"{report.meta.get('machine', '')}; set-up "
        f"{report.meta.get('setup_seconds')} s.", "",
        "## Ledger", "", "| | |", "|---|---|",
        f"| acknowledged by the API | {led['acknowledged']:,} ({', '.join(f'{k} {v:,}' for k, v in sorted(led['acknowledged_by_kind'].items()))}) |",  # noqa: E501
        f"| delivered (provider side or feed, unique) | {led['delivered']:,} of {led['expected_deliveries']:,}"
        f" expected ({', '.join(f'{k} {v:,}' for k, v in sorted(led['delivered_by_kind'].items()))}) |",
        f"| suppressed (opted out) | {led['suppressed']:,}; sent anyway: {led['suppressed_but_sent']} |",
        f"| **lost** | **{led['lost']}** |",
        f"| duplicates at the provider | {led['duplicates']} ({led['duplicates_after_timeout']} after a send that timed out; "  # noqa: E501
        f"{led['duplicates_outside_in_flight']} outside a kill's in-flight set or a timeout) |",
        f"| events delivered (≥ 1 per delivered notification) | {led['events_delivered']:,}; missing {led['events_missing']}; duplicates {led['event_duplicates']} |",  # noqa: E501
        f"| receipts acknowledged | {led['receipts_acknowledged']:,} for {led['receipt_notifications']:,} notifications; not shown {led['receipts_missing']} |",  # noqa: E501
        f"| native push (FCM, APNs and Web Push stand-ins) | {led.get('push_arrivals', 0):,} arrived (fcm "
        f"{led['delivered_by_kind'].get('fcm', 0):,}, apns {led['delivered_by_kind'].get('apns', 0):,}, "
        f"webpush {led['delivered_by_kind'].get('webpush', 0):,}); "
        f"duplicates {led.get('push_duplicates', 0)}; refused as malformed {led.get('push_refused', 0)} |",
        f"| workflow triggers | {led.get('workflow_triggers', 0):,}; runs {led.get('workflow_runs', 0):,} "
        f"({', '.join(f'{k} {v:,}' for k, v in sorted(led.get('workflow_runs_by_status', {}).items()))}); "
        f"without a run {led.get('workflow_triggers_without_runs', 0)}; send steps' notifications "
        f"{led.get('workflow_notifications', 0):,}, arrived {led.get('workflow_notifications_delivered', 0):,} |",
        f"| test key (to the simulator) | {led.get('test_notifications', 0):,} "
        f"({', '.join(f'{k} {v:,}' for k, v in sorted(led.get('test_by_status', {}).items(), key=str))}; receipts "
        f"{', '.join(f'{k} {v:,}' for k, v in sorted(led.get('test_receipts', {}).items()))}); not as the address "
        f"implies {led.get('test_not_as_expected', 0)}; reached a provider or feed {led.get('test_arrived', 0)}; "
        f"listed to the live key {led.get('test_listed_live', 0)} (live ones to the test key "
        f"{led.get('live_listed_to_test', 0)}) |",
        f"| topic triggers | {led.get('topic_triggers', 0)} to {led.get('topic_members', 0):,} members; runs "
        f"{led.get('topic_runs', 0):,}, completed {led.get('topic_runs_completed', 0):,}; not one per member "
        f"{led.get('topic_wrong', 0)} |",
        f"| bulk send | {led.get('bulk_status')}; {led.get('bulk_rows')} rows, {led.get('bulk_notifications', 0)} "
        f"notifications ({led.get('bulk_distinct_rows', 0)} rows), delivered {led.get('bulk_delivered', 0)}; "
        f"duplicates {led.get('bulk_duplicates', 0)} |",
        f"| API and provider disagree | {led['api_provider_mismatch']} |",
        f"| arrivals the API never acknowledged | {led['arrivals_not_acknowledged']} |",
        f"| pickup p50 / p99 / max | {led['pickup_ms']['p50']} / {led['pickup_ms']['p99']} / {led['pickup_ms']['max']} ms |",  # noqa: E501
        f"| processes alive at the end | {led['processes_alive']} of {led['processes']}; restarts {led['restarts']}; unexplained exits {led['unexplained_exits']} |",  # noqa: E501
        f"| load | offered {report.load['offered']:,}, shed {report.load['shed']:,}, acknowledged {report.load['acknowledged_per_second']}/s, retried requests {report.load['retried_requests']} |",  # noqa: E501
        f"| API statuses | {', '.join(f'{k} {v:,}' for k, v in sorted(led['api_statuses'].items()))} |",
        "", "## Kills and their in-flight bound", "", "| at (s) | fault | process | in flight | duplicates |",
        "|---:|---|---|---:|---:|",
        *[f"| {k['at']} | {k['kind']} | {k['target']} | {k['in_flight']} | {k['duplicates']} |" for k in led["kills"]],
        "", "## Faults", "",
        f"By kind: {', '.join(f'{k} {v}' for k, v in sorted(led['faults_by_kind'].items()))}.", "",
        "| at (s) | fault | target | lasted (s) | detail | recovered after (s) |", "|---:|---|---|---:|---|---:|",
        *[f"| {f['at']} | {f['kind']} | {f['target']} | {f['seconds']} | {f['detail']} | {f['recovered_after']} |"
          for f in report.faults],
        "", "Recovery: from the fault's end (a killed process back up, a mode switched back, the server "
        "started again) to the first arrival of a notification due after it that took at most "
        f"{RECOVERED_PICKUP:g} s from due to arrival (the fault's backlog is behind it); after a scheduler's "
        "kill, of a future-dated one; after the event endpoint's outage, of the first event. A failover ends "
        "when the standby is promoted (and PgBouncer repointed), a PgBouncer restart when it listens again.", "",
        "## Processes", "",
        "RSS (MB, the process and its children) and open files, first → last sample of each incarnation; growth: "
        "median of the last quarter of its samples less that of the second quarter (incarnations sampled "
        f"{GROWTH_MIN_SECONDS:g} s or more; more than {GROWTH_MAX_RSS_MB:g} MB or {GROWTH_MAX_FILES} files fails).",
        "", "| process | starts | killed | unexplained exits | RSS MB | open files | growth (MB, files) |",
        "|---|---:|---:|---:|---|---|---|",
    ]  # fmt: skip
    for name, proc in report.processes.items():
        rss = "; ".join(f"{i['rss_mb_first']}→{i['rss_mb_last']}" for i in proc["incarnations"])
        files = "; ".join(f"{i['files_first']}→{i['files_last']}" for i in proc["incarnations"])
        grew = "; ".join(f"{i['rss_growth_mb']:+}, {i['files_growth']:+}" for i in proc["incarnations"]
                         if "rss_growth_mb" in i) or "–"  # fmt: skip
        lines.append(f"| {name} | {proc['starts']} | {proc['killed_by_soak']} | {proc['unexplained_exits']} "
                     f"| {rss} | {files} | {grew} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def png(report: Report, path: Path) -> None:
    """Throughput and pickup p99 over time, faults as shaded spans and markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = report.timeline["t"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True)
    top.plot(t, report.timeline["delivered_per_second"], color="black", linewidth=1)
    top.set_ylabel("delivered / s")
    p99 = [v if v is not None else float("nan") for v in report.timeline["pickup_p99_ms"]]
    bottom.plot(t, p99, color="black", linewidth=1)
    bottom.set_yscale("log")
    bottom.set_ylabel("pickup p99 (ms, by due time)")
    bottom.set_xlabel("seconds since the load started")
    colours = dict(zip(FAULT_KINDS, plt.get_cmap("tab20").colors, strict=False))
    seen: set[str] = set()
    for f in report.faults:
        colour = colours.get(f["kind"], "grey")
        for ax in (top, bottom):
            ax.axvspan(f["at"], f["at"] + max(f["seconds"] or 0, 0.3), color=colour, alpha=0.2)
        top.axvline(f["at"], color=colour, linewidth=1, label=None if f["kind"] in seen else f["kind"])
        seen.add(f["kind"])
    top.legend(loc="upper left", fontsize=7, ncol=3)
    cfg = report.config
    fig.suptitle(f"OmniPost chaos soak: {cfg['rate']:g}/s, a fault every {cfg['fault_every']:g} s, "
                 f"lost {report.ledger['lost']}, duplicates {report.ledger['duplicates']}")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(config: SoakConfig) -> Report:
    return Soak(config).run()
