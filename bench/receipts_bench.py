"""Receipt ingestion: signed receipts accepted per second through `POST /hooks/providers/{id}`.

    .venv/bin/python bench/receipts_bench.py [--kind webhook|twilio] [--database-url URL] [--seconds 10]
        [--repeat 3] [--server gunicorn|granian] [--worker-class gthread|asgi] [--workers 2] [--threads 4]
        [--clients 8] [--notifications 20000]

Runs the web server (gunicorn: `--workers` gthread processes with `--threads` each, or with
`--worker-class asgi` its asgi worker serving omnipost_site.asgi, receipts.asgi's 2 threads each; or
granian's WSGI interface, `--workers` processes with `--threads` blocking threads each; DEBUG off) on a throwaway
database (`omnipost_bench_receipts`, its notification and receipt tables emptied at start) holding
`--notifications` delivered notifications of one tenant's provider of `--kind`. Before each run it
signs one distinct event per request it may send (a `delivered` receipt for a notification, in turn;
a new event id each, so every one is applied, none is a duplicate), as raw HTTP/1.1 requests:
`webhook`, a Standard Webhooks event signed with the `standardwebhooks` package; `twilio`, a status
callback (form fields, the notification id in the URL's `?n=`) signed with the `twilio` package's
`RequestValidator` (needs the twilio adapter, receipts/vendors/twilio.py). The load generator is a separate process
of `--clients` threads on keep-alive raw sockets that write those prepared bytes and read the
answers: it neither signs nor parses JSON in the timed loop, so the figure measures the server —
signature check, provider lookup, the one apply statement — not the client.

Prints receipts per second and request latency p50/p99 (median of `--repeat` runs), the CPU time
the web processes and their database sessions spent per receipt (read from /proc, so the figure
holds even on a machine other work shares), then checks the database holds exactly one event per
`200` answer.
Targets (issue 22): ≥ 2,000 receipts/s, p99 < 50 ms, on 2 gunicorn workers.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from ingest_bench import ensure_database, free_port, server_env  # noqa: E402

DEFAULT_DB = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_bench_receipts"
APP_NAME = "omnipost-receipts-bench"
SECRET = "whsec_" + base64.b64encode(b"receipts-bench-signing-key-32by").decode()
AUTH_TOKEN = "bench0auth0token0bench0auth0tok"  # noqa: S105 - a bench-only Twilio auth token
ACCOUNT_SID = "AC" + "0" * 32


def prepare(database_url: str, count: int, kind: str = "webhook") -> tuple[int, list[str]]:
    """Migrate, empty the tables (throwaway databases only), create a tenant, its provider of `kind`
    and `count` delivered notifications; return the provider id and the notification ids."""
    env = server_env(database_url)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connection

    from core.models import Tenant
    from notifications.models import Notification
    from providers.models import Provider

    if urlsplit(database_url).path.lstrip("/").startswith("omnipost_bench"):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE notification_events, receipt_dedup, receipt_counters, queue_state, "
                           "scheduled_jobs, delivery_attempts, notifications CASCADE")  # fmt: skip
    tenant = Tenant.objects.create(name=f"receipts-bench-{int(time.time() * 1000)}")
    if kind == "twilio":
        provider = Provider.objects.create(
            tenant=tenant, name="sms", kind="twilio", channel="sms", is_default=True,
            config={"account_sid": ACCOUNT_SID, "from_number": "+15550006666", "base_url": "https://api.twilio.com"},
            secrets={"auth_token": AUTH_TOKEN},
        )  # fmt: skip
        channel, recipient, masked = "sms", "+15551234567", "+1******4567"
    else:
        provider = Provider.objects.create(
            tenant=tenant, name="hook", kind="webhook", channel="webhook", is_default=True,
            config={"url": "https://receiver.example/hook", "timeout_seconds": 5.0}, secrets={"signing_secret": SECRET},
        )  # fmt: skip
        channel, recipient, masked = "webhook", "cust_8Kq2", "cust_****"
    token = Notification._meta.get_field("recipient").get_prep_value(recipient)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, context,
                subject, body, priority, queue, status, metadata, attempt_count, attempt_offset, last_error_code,
                created_at, updated_at, delivered_at)
            SELECT gen_random_uuid(), %s, %s, %s, %s, %s, '{}', '', 'b', 5, 'default', 'delivered',
                   '{}', 1, 0, '', now(), now(), now()
            FROM generate_series(1, %s)
            RETURNING id
            """,
            [tenant.pk, channel, token, masked, provider.pk, count],
        )
        ids = [str(row[0]) for row in cursor.fetchall()]
        cursor.execute("ANALYZE notifications")
    connection.close()
    return provider.pk, ids


def signed_requests(port: int, provider_id: int, ids: list[str], n: int, kind: str = "webhook") -> list[bytes]:
    """`n` raw HTTP requests, each a distinct signed `delivered` event (the vendor's own package signs)."""
    if kind == "twilio":
        return twilio_requests(port, provider_id, ids, n)
    from standardwebhooks.webhooks import Webhook

    hook = Webhook(SECRET)
    now = datetime.now(UTC)
    stamp = str(int(now.timestamp()))
    occurred = now.isoformat()
    out = []
    for i in range(n):
        body = json.dumps({"type": "delivered", "notification_id": ids[i % len(ids)], "occurred_at": occurred,
                           "details": {"attempt": i}})  # fmt: skip
        msg_id = f"msg_{uuid.uuid4().hex}"
        signature = hook.sign(msg_id, now, body)
        head = (f"POST /hooks/providers/{provider_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nwebhook-id: {msg_id}\r\n"
                f"webhook-timestamp: {stamp}\r\nwebhook-signature: {signature}\r\n\r\n")  # fmt: skip
        out.append(head.encode() + body.encode())
    return out


def twilio_requests(port: int, provider_id: int, ids: list[str], n: int) -> list[bytes]:
    from urllib.parse import urlencode

    from twilio.request_validator import RequestValidator

    validator = RequestValidator(AUTH_TOKEN)
    out = []
    for i in range(n):
        path = f"/hooks/providers/{provider_id}?n={ids[i % len(ids)]}"
        params = {"AccountSid": ACCOUNT_SID, "MessageSid": f"SM{uuid.uuid4().hex}", "MessageStatus": "delivered",
                  "To": "+15551234567", "From": "+15550006666", "ApiVersion": "2010-04-01"}  # fmt: skip
        signature = validator.compute_signature(f"http://127.0.0.1:{port}{path}", params)
        body = urlencode(params)
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n"
                f"X-Twilio-Signature: {signature}\r\n\r\n")  # fmt: skip
        out.append(head.encode() + body.encode())
    return out


# --- load generator (its own process) ---------------------------------------------------------------


def _answer(sock: socket.socket, buffer: bytearray) -> int:
    """Read one response from a keep-alive connection; its status."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buffer += chunk
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end]).decode("latin-1")
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    while len(buffer) < end + length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buffer += chunk
    del buffer[: end + length]
    return int(head.split(" ", 2)[1])


def load(port: int, requests: list[bytes], clients: int, seconds: float, out: multiprocessing.Queue) -> None:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    per_client = len(requests) // clients

    def client(index: int) -> None:
        mine: list[float] = []
        counts: dict[int, int] = {}
        share = requests[index * per_client : (index + 1) * per_client]
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = bytearray()
        for request in share:
            if time.monotonic() >= stop_at:
                break
            started = time.perf_counter()
            try:
                sock.sendall(request)
                status = _answer(sock, buffer)
            except (ConnectionError, OSError):
                sock.close()
                sock = socket.create_connection(("127.0.0.1", port))
                buffer = bytearray()
                status = 0
            mine.append(time.perf_counter() - started)
            counts[status] = counts.get(status, 0) + 1
        sock.close()
        with lock:
            latencies.extend(mine)
            for status, n in counts.items():
                statuses[status] = statuses.get(status, 0) + n

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put({"elapsed": time.monotonic() - started, "latencies": latencies, "statuses": statuses})


def run(port: int, requests: list[bytes], clients: int, seconds: float) -> dict:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=load, args=(port, requests, clients, seconds, out))
    process.start()
    result = out.get(timeout=seconds + 300)
    process.join()
    latencies = sorted(result["latencies"])
    accepted = result["statuses"].get(200, 0)
    return {
        "accepted": accepted,
        "per_s": accepted / result["elapsed"],
        "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else 0.0,
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0,
        "statuses": result["statuses"],
    }


def _ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def cpu_seconds(server: subprocess.Popen, database_url: str) -> tuple[float, float]:
    """CPU seconds so far of the server's processes and of their database sessions."""
    import psycopg

    hz = os.sysconf("SC_CLK_TCK")
    web = sum(_ticks(p) for p in [server.pid, *_children(server.pid)])
    with psycopg.connect(database_url, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [APP_NAME]
        )]  # fmt: skip
    return web / hz, sum(_ticks(p) for p in pids) / hz


def events(database_url: str) -> int:
    import psycopg

    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT count(*) FROM notification_events").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=["webhook", "twilio"], default="webhook")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server", choices=["gunicorn", "granian"], default="gunicorn")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-class", choices=["gthread", "asgi"], default="gthread", help="gunicorn's")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--notifications", type=int, default=20_000)
    parser.add_argument("--max-rate", type=float, default=6_000.0, help="requests prepared per second of a run")
    args = parser.parse_args()

    ensure_database(args.database_url)
    provider_id, ids = prepare(args.database_url, args.notifications, args.kind)
    port = free_port()
    env = {**server_env(args.database_url), "OMNIPOST_APP_NAME": APP_NAME,
           "OMNIPOST_PUBLIC_URL": f"http://127.0.0.1:{port}"}  # fmt: skip
    if args.server == "granian":
        command = [sys.executable, "-m", "granian", "--interface", "wsgi", "--workers", str(args.workers),
                   "--blocking-threads", str(args.threads), "--host", "127.0.0.1", "--port", str(port),
                   "--log-level", "warning", "--no-ws", "omnipost_site.wsgi:application"]  # fmt: skip
    else:
        command = [str(Path(sys.executable).with_name("gunicorn")), "--workers", str(args.workers), "--bind",
                   f"127.0.0.1:{port}", "--timeout", "120", "--log-level", "warning"]  # fmt: skip
        if args.worker_class == "asgi":  # receipts.asgi's pool: 4 threads a worker
            command += ["--worker-class", "asgi", "omnipost_site.asgi:application"]
        else:
            command += ["--worker-class", "gthread", "--threads", str(args.threads), "omnipost_site.wsgi:application"]
    server = subprocess.Popen(command, cwd=ROOT, env=env)  # noqa: S603
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"{args.server} did not come up")
        time.sleep(0.2)
    runs = []
    try:
        # Warm both workers (the provider view cache, the database connections).
        warm = run(port, signed_requests(port, provider_id, ids, 200, args.kind), 4, 5.0)
        if warm["statuses"] != {200: 200}:
            raise SystemExit(f"warm-up answers {warm['statuses']}: is the {args.kind} adapter installed?")
        before = events(args.database_url)
        total = 0
        for _ in range(args.repeat):
            requests = signed_requests(port, provider_id, ids, int(args.max_rate * args.seconds), args.kind)
            web0, db0 = cpu_seconds(server, args.database_url)
            result = run(port, requests, args.clients, args.seconds)
            web1, db1 = cpu_seconds(server, args.database_url)
            result["web_ms"] = 1000 * (web1 - web0) / max(1, result["accepted"])
            result["db_ms"] = 1000 * (db1 - db0) / max(1, result["accepted"])
            runs.append(result)
            total += result["accepted"]
            print(f"{result['per_s']:9.0f} receipts/s  p50 {result['p50_ms']:6.1f} ms  p99 {result['p99_ms']:6.1f} ms"
                  f"  CPU/receipt web {result['web_ms']:.2f} ms db {result['db_ms']:.2f} ms"
                  f"  statuses {result['statuses']}")
        stored = events(args.database_url) - before
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    med = {k: statistics.median(r[k] for r in runs) for k in ("per_s", "p50_ms", "p99_ms", "web_ms", "db_ms")}
    server_name = f"gunicorn {args.worker_class}" if args.server == "gunicorn" else "granian wsgi"
    threads = "2 receipts threads (receipts.asgi)" if server_name == "gunicorn asgi" else f"{args.threads} threads"
    print(f"\n{server_name}: {args.workers} workers x {threads}, {os.cpu_count()} CPUs, "
          f"{args.clients} clients, {args.seconds:g} s per run, median of {args.repeat}:")
    scheme = {"webhook": "Standard Webhooks", "twilio": "X-Twilio-Signature"}[args.kind]
    print(f"  POST /hooks/providers/{{id}} ({args.kind} kind, {scheme} verified)  {med['per_s']:7.0f} receipts/s"
          f"   p50 {med['p50_ms']:5.1f} ms   p99 {med['p99_ms']:5.1f} ms")
    print(f"  CPU per receipt: web processes {med['web_ms']:.2f} ms, their database sessions {med['db_ms']:.2f} ms")
    print(f"  accepted {total}, events stored {stored}: {'OK' if total == stored else 'MISMATCH'}")
    if total != stored:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
