"""Past one machine (issue 25): three dispatchers on three "hosts" (network
namespaces, each with its own hostname) and the API with a scheduler on a fourth, every process
through one PgBouncer in transaction pooling mode (`OMNIPOST_DATABASE_POOLER=pgbouncer`, no LISTEN
URL: they poll alone). The test posts 2,000 notifications over the veth to gunicorn; the receiver
counts webhook-ids: none lost, none twice. PgBouncer listens on the machine's side of each veth pair
and connects to the test database's server; its pool is smaller than its clients, so consecutive
transactions of one process do run on different server connections."""

from __future__ import annotations

import collections
import json
import re
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from io import StringIO
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from notifications.models import Notification
from queueing.models import Worker
from tests import factories
from tests.queueing.dispatch_support import wait_exit, wait_until
from tests.support.netns import Hosts
from tests.support.pgbouncer import PrivatePgBouncer
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = str(Path(sys.executable).with_name("gunicorn"))
TOTAL, SCHEDULED = 2000, 50
POOL_SIZE = 4
DISPATCHER_HOSTS = ("omnipost-host-1", "omnipost-host-2", "omnipost-host-3")


def server_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db.get('PASSWORD') or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def post_all(api: str, raw_key: str, bodies: list[dict], threads: int = 4) -> list[str]:
    """POST every body (in `threads` parallel clients); the ids of the 201s, in no order."""
    ids: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client(part: list[dict]) -> None:
        with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {raw_key}"}, timeout=30) as http:
            for body in part:
                response = http.post("/api/v1/notifications", json=body)
                with lock:
                    if response.status_code == 201:
                        ids.append(response.json()["id"])
                    else:
                        failures.append(f"{response.status_code} {response.text[:200]}")

    workers = [threading.Thread(target=client, args=(bodies[i::threads],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert not failures, failures[:3]
    return ids


def test_three_dispatcher_hosts_drain_through_pgbouncer_losing_and_doubling_nothing(
    tenant_a, key_a, subprocess_env, tmp_path
):
    hosts = Hosts(4)
    with hosts, HttpReceiver(secret=TEST_SIGNING_SECRET, host=hosts.gateway(0), max_seconds=300) as receiver:
        factories.provider(tenant_a, "hook", config={"url": receiver.url},
                           secrets={"signing_secret": TEST_SIGNING_SECRET}, is_default=True)  # fmt: skip
        with PrivatePgBouncer(server_url(), listen=hosts.gateways(), pool_size=POOL_SIZE) as bouncer:
            dbname = connection.settings_dict["NAME"]

            def env_on(i: int, **extra: str) -> dict[str, str]:
                return {**subprocess_env, "DATABASE_URL": bouncer.url(dbname, host=hosts.gateway(i)),
                        "OMNIPOST_DATABASE_POOLER": "pgbouncer", "OMNIPOST_LOG_LEVEL": "INFO", **extra}  # fmt: skip

            def start(i: int, argv: list[str], hostname: str, log: str, **extra: str) -> subprocess.Popen:
                out = open(tmp_path / log, "w")  # noqa: SIM115 - closed with the test's tmp_path
                return hosts.popen(i, argv, hostname=hostname, cwd=ROOT, env=env_on(i, **extra), stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip

            web = hosts.address(3)
            api = start(3, [GUNICORN, "omnipost_site.wsgi:application", "--workers", "2", "--threads", "4",
                            "--bind", f"{web}:8000", "--log-level", "warning"], "omnipost-web", "web.log",
                        ALLOWED_HOSTS=web, OMNIPOST_RATE_LIMIT_API="0", CONN_MAX_AGE="60")  # fmt: skip
            scheduler = start(3, [sys.executable, "manage.py", "run_scheduler", "--no-jitter"], "omnipost-web",
                              "scheduler.log")  # fmt: skip
            dispatchers = [
                start(i, [sys.executable, "manage.py", "run_dispatcher", "--no-jitter", "--concurrency", "50",
                          "--batch-size", "50"], name, f"dispatcher{i}.log")
                for i, name in enumerate(DISPATCHER_HOSTS)
            ]  # fmt: skip
            base = f"http://{web}:8000"

            def up() -> bool:
                try:
                    return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
                except httpx.TransportError:
                    return False

            assert wait_until(up, 60), (tmp_path / "web.log").read_text()[-2000:]
            later = (timezone.now() + timedelta(seconds=3)).isoformat()
            bodies = [{"channel": "webhook", "recipient": f"user-{n}", "subject": "s", "body": f"n{n}",
                       **({"scheduled_for": later} if n < SCHEDULED else {})} for n in range(TOTAL)]  # fmt: skip
            servers_seen, clients_seen = [0], [0]

            def drained() -> bool:
                pools = [p for p in bouncer.show("POOLS") if p["database"] == dbname]
                servers_seen[0] = max(servers_seen[0], sum(p["sv_active"] + p["sv_idle"] + p["sv_used"] for p in pools))
                clients_seen[0] = max(clients_seen[0], sum(p["cl_active"] + p["cl_waiting"] for p in pools))
                return receiver.stats()["accepted_unique"] >= TOTAL and not Notification.objects.exclude(
                    status="delivered").exists()  # fmt: skip

            accepted = post_all(base, key_a, bodies)
            assert len(accepted) == TOTAL
            assert wait_until(drained, 240, interval=0.5), {
                log.name: log.read_text()[-1500:] for log in tmp_path.glob("*.log")}  # fmt: skip

            out = StringIO()
            call_command("queue_stats", "--json", stdout=out)  # while they run: stopped workers are not listed
            listed = json.loads(out.getvalue())["workers"]

            for proc in [*dispatchers, scheduler]:
                proc.send_signal(signal.SIGTERM)
            codes = wait_exit([*dispatchers, scheduler], 60)
            api.send_signal(signal.SIGTERM)
            wait_exit([api], 30)
            bouncer_log = bouncer.log_text()

    delivered = collections.Counter(r.webhook_id for r in receiver.requests if 200 <= r.status < 300)
    assert set(delivered) == set(accepted)  # 0 lost
    assert max(delivered.values()) == 1  # 0 duplicates
    assert codes == [0, 0, 0, 0], {log.name: log.read_text()[-1500:] for log in tmp_path.glob("*.log")}
    assert Notification.objects.filter(status="delivered").count() == TOTAL

    dispatchers_seen = {(w["host"], w["pid"]) for w in listed if w["kind"] == "dispatcher"}
    assert {host for host, _ in dispatchers_seen} == set(DISPATCHER_HOSTS)
    assert {(w["host"], w["kind"]) for w in listed if w["kind"] == "scheduler"} == {("omnipost-web", "scheduler")}
    assert set(Worker.objects.filter(kind="dispatcher").values_list("host", flat=True)) == set(DISPATCHER_HOSTS)
    by_host = {i: int(re.search(r"stopped after (\d+) deliveries", (tmp_path / f"dispatcher{i}.log").read_text())[1])
               for i in range(len(DISPATCHER_HOSTS))}  # fmt: skip
    assert sum(by_host.values()) == TOTAL and min(by_host.values()) > 0, by_host  # every host took a share

    # Transaction pooling did multiplex: more clients than server connections, never above the pool.
    assert 0 < servers_seen[0] <= POOL_SIZE < clients_seen[0], (servers_seen, clients_seen)
    assert "prepared statement" not in bouncer_log and "ERROR" not in bouncer_log, bouncer_log[-2000:]
