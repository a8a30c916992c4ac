"""Ingest throughput: notifications accepted per second through the HTTP API.

    .venv/bin/python bench/ingest_bench.py [--database-url URL] [--seconds 10] [--repeat 3]
        [--server gunicorn|granian|granian-asgi|uvicorn] [--workers 2] [--worker-class sync|gthread] [--threads 4]
        [--asgi-app project|django]
        [--single-clients 8] [--batch-clients 4] [--modes single,keyed,batch,subscribers,read] [--client raw|httpx]
        [--keys 40000] [--pgbench]

Runs the web server (`--workers` processes, DEBUG off) on the database: gunicorn (`--worker-class`
sync or gthread with `--threads`), granian's WSGI interface (`--threads` blocking threads per
worker), granian's ASGI interface as `make run` runs it (`granian-asgi`: the API in `--threads`
threads a worker) or uvicorn on the ASGI application (`--asgi-app`: the project's, omnipost_site.asgi
with the WSGI application under a2wsgi, or the same under Django's own ASGI handler,
bench/asgi_variants.py); then a load generator in a separate process: in mode
`single`, `--single-clients` keep-alive connections hammering `POST /api/v1/notifications`;
`batch`, `--batch-clients` connections sending `POST /api/v1/notifications/batch` with
`--batch-size` items; `keyed`, as `single` but each request with an `Idempotency-Key` of its own
(`--keys` prepared per run, never repeated: a repeat would be a replay, not stored, and fail the
final check); `subscribers`, the same batches naming `--batch-size` distinct subscribers
(created beforehand) instead of a recipient, each resolved to its email address at creation; `read`,
`--single-clients` connections reading `GET /api/v1/notifications/{id}`
(with attempts) of notifications created beforehand.
The load generator (`bench/loadgen.py`, `--client raw`) is raw sockets on one selector loop, so
the figure measures the server: it costs 60–100 µs of CPU a request, where the former httpx client
per thread (`--client httpx`, kept for comparison) cost 540–560 µs, 40 % of one of the machine's
two cores at 700 requests a second. Prints accepted notifications per second, request latency
p50/p99 and CPU per request of the server's processes, of the database backends serving them
and of the client, per mode (median of `--repeat` runs; CPU from /proc, which the machine's other
load disturbs far less than the rate), and checks the database holds exactly what was accepted.
`--pgbench` follows each run of a creating mode with `pgbench` one-row inserts (the same clients
and seconds, a table of its own in the same database, `pgbench -n -c C -j 2 -T S`) and prints the
run's creates over pgbench's rate: the create path against the database's floor in the same minute.
No dispatcher runs, so every accepted notification stays queued. The default database is a
throwaway one the script creates (`omnipost_bench_ingest`); its notification tables are emptied at start.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # loadgen, in the spawned load process too
DEFAULT_DB = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_bench_ingest"
BENCH_KEY = "x8ROxZ3gJ9D2CFFGZuxGvUQoLhPn7cVeLBcLd2R9s0c="  # bench-only Fernet key
APP_NAME = "omnipost-ingest-bench"  # the server's backends, whose CPU the bench reads
EMAIL_ITEM = {"channel": "email", "recipient": "jane.doe@example.com", "subject": "Your order",
              "body": "Order 1234 has shipped.", "metadata": {"order": 1234}}  # fmt: skip


def server_env(database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "omnipost_site.settings",
        "DATABASE_URL": database_url,
        "DEBUG": "false",
        "SECRET_KEY": "bench-only-secret-key-not-for-production-0123456789",
        "ALLOWED_HOSTS": "127.0.0.1",
        "OMNIPOST_ENCRYPTION_KEYS": BENCH_KEY,
        "OMNIPOST_RATE_LIMIT_API": str(10**9),
        "OMNIPOST_LOG_LEVEL": "WARNING",
        "CONN_MAX_AGE": "600",
        "OMNIPOST_APP_NAME": APP_NAME,
    }


def ensure_database(database_url: str) -> None:
    import psycopg

    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def prepare(database_url: str, subscribers: int = 0) -> str:
    """Migrate, empty the notification tables (throwaway databases only), create a tenant; return its key."""
    env = server_env(database_url)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connection

    from core.models import ApiKey, Tenant
    from providers.models import Provider

    if urlsplit(database_url).path.lstrip("/").startswith("omnipost_bench"):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE queue_state, scheduled_jobs, delivery_attempts, idempotency_records, "
                           "notifications CASCADE")  # fmt: skip
    tenant = Tenant.objects.create(name=f"ingest-bench-{int(time.time() * 1000)}")
    Provider.objects.create(tenant=tenant, name="console", kind="console", channel="email", is_default=True)
    raw_key = ApiKey.issue(tenant, name="bench")[1]
    if subscribers:
        from recipients.services import clean_subscriber, upsert_subscribers

        upsert_subscribers(tenant, [clean_subscriber({"external_id": f"bench-{i}", "email": f"user{i}@example.com"})
                                    for i in range(subscribers)])  # fmt: skip
    connection.close()
    return raw_key


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def asgi_target(args: argparse.Namespace) -> str:
    return "omnipost_site.asgi:application" if args.asgi_app == "project" else "asgi_variants:application"


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    if args.server == "granian":
        return [sys.executable, "-m", "granian", "--interface", "wsgi", "--workers", str(args.workers),
                "--blocking-threads", str(args.threads), "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warning", "--no-ws", "omnipost_site.wsgi:application"]  # fmt: skip
    if args.server == "granian-asgi":  # make run's: the API in --threads threads a worker
        return [sys.executable, "-m", "granian", "--interface", "asgi", "--workers", str(args.workers),
                "--backpressure", "4096", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                "--no-ws", asgi_target(args)]  # fmt: skip
    if args.server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", asgi_target(args), "--workers", str(args.workers),
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
                "--loop", "uvloop", "--http", "httptools"]  # fmt: skip
    command = [
        str(Path(sys.executable).with_name("gunicorn")), "omnipost_site.wsgi:application",
        "--workers", str(args.workers), "--bind", f"127.0.0.1:{port}", "--worker-class", args.worker_class,
        "--timeout", "120", "--log-level", "warning",
    ]  # fmt: skip
    if args.worker_class == "gthread":
        command += ["--threads", str(args.threads)]
    return command


def start_gunicorn(args: argparse.Namespace, port: int) -> subprocess.Popen:
    env = {**server_env(args.database_url), "OMNIPOST_WEB_THREADS": str(args.threads)}
    if args.asgi_app != "project":  # bench/asgi_variants.py, the adapter it names
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "bench"), env.get("PYTHONPATH")]))
        env["BENCH_ASGI_APP"] = args.asgi_app
    if args.extra_path:  # e.g. a directory with granian/uvicorn installed beside the virtualenv
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.extra_path, env.get("PYTHONPATH")]))
    process = subprocess.Popen(server_command(args, port), cwd=ROOT, env=env)  # noqa: S603
    deadline = time.monotonic() + 90  # a loaded machine starts two Django workers slowly
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.terminate()  # SIGTERM: granian stops its workers (a SIGKILL to it alone would orphan them)
    process.wait(timeout=30)
    raise SystemExit(f"{args.server} did not come up")


# --- load generator (its own process) ---------------------------------------------------------


def load(
    port: int, url: str | list[str], key: str, body: bytes | None, per_request: int, clients: int, seconds: float,
    client: str, out: multiprocessing.Queue, keys: int = 0,
) -> None:
    if client == "httpx":
        out.put(load_httpx(port, url, key, body, per_request, clients, seconds))
        return
    from loadgen import request_bytes, run

    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    paths = url if isinstance(url, list) else [url]
    if keys:  # one Idempotency-Key a request, this run's own
        run_id = os.urandom(6).hex()
        requests = [request_bytes("POST", paths[0], {**headers, "Idempotency-Key": f"bench-{run_id}-{i}"}, body or b"")
                    for i in range(keys)]  # fmt: skip
    else:
        requests = [request_bytes("GET" if body is None else "POST", path, headers, body or b"") for path in paths]
    result = run("127.0.0.1", port, requests, clients=clients, seconds=seconds)
    out.put({"elapsed": result.elapsed, "latencies": result.latencies, "statuses": result.statuses,
             "per_request": per_request, "client_cpu": result.client_cpu_seconds})  # fmt: skip


def load_httpx(
    port: int, url: str | list[str], key: str, body: bytes | None, per_request: int, clients: int, seconds: float
) -> dict:
    """The former generator (a thread and an httpx client per connection), kept for comparison."""
    import resource

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    base = f"http://127.0.0.1:{port}"

    def client() -> None:
        mine: list[float] = []
        counts: dict[int, int] = {}
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        urls = url if isinstance(url, list) else [url]
        n = 0
        with httpx.Client(timeout=120, base_url=base) as http:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                if body is None:
                    response = http.get(urls[n % len(urls)], headers=headers)
                    n += 1
                else:
                    response = http.post(urls[0], content=body, headers=headers)
                mine.append(time.perf_counter() - started)
                counts[response.status_code] = counts.get(response.status_code, 0) + 1
        with lock:
            latencies.extend(mine)
            for status, n in counts.items():
                statuses[status] = statuses.get(status, 0) + n

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    return {"elapsed": elapsed, "latencies": latencies, "statuses": statuses, "per_request": per_request,
            "client_cpu": cpu}  # fmt: skip


# --- CPU of the server and of PostgreSQL ---------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    return total


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (the server's workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _backends(database_url: str) -> list[int]:
    import psycopg

    with psycopg.connect(database_url) as conn:
        return [row[0] for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [APP_NAME]).fetchall()]  # fmt: skip


def run_mode(
    port: int, url: str | list[str], key: str, body: bytes | None, per_request: int, clients: int, seconds: float,
    *, client: str, server_pid: int, database_url: str, keys: int = 0,
) -> dict:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(
        target=load, args=(port, url, key, body, per_request, clients, seconds, client, out, keys)
    )
    server = _tree(server_pid)
    backends = _backends(database_url)
    cpu_before = (_cpu_of(server), _cpu_of(backends))
    process.start()
    result = out.get(timeout=seconds + 300)
    process.join()
    cpu_after = (_cpu_of(server), _cpu_of(backends + [p for p in _backends(database_url) if p not in backends]))
    latencies = sorted(result["latencies"])
    requests = len(latencies)
    accepted = (result["statuses"].get(201, 0) + result["statuses"].get(200, 0)) * per_request
    return {
        "accepted": accepted,
        "accepted_per_s": accepted / result["elapsed"],
        "requests": requests,
        "p50_ms": 1000 * latencies[requests // 2] if latencies else 0.0,
        "p99_ms": 1000 * latencies[min(requests - 1, int(requests * 0.99))] if latencies else 0.0,
        "statuses": result["statuses"],
        # CPU a request: the server's processes, the database's backends, the load generator
        "server_us": 1e6 * (cpu_after[0] - cpu_before[0]) / max(1, requests),
        "db_us": 1e6 * (cpu_after[1] - cpu_before[1]) / max(1, requests),
        "client_us": 1e6 * result["client_cpu"] / max(1, requests),
    }


PGBENCH_TABLE = "bench_pgbench_rows"


def pgbench_rate(database_url: str, clients: int, seconds: float) -> float:
    """One-row inserts a second by `pgbench` with `clients` connections, each its own transaction."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {PGBENCH_TABLE} (id bigserial PRIMARY KEY, payload text)")
        conn.execute(f"TRUNCATE {PGBENCH_TABLE}")
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(f"INSERT INTO {PGBENCH_TABLE} (payload) VALUES ('x');\n")
        script.flush()
        out = subprocess.run(
            ["pgbench", "-n", "-c", str(clients), "-j", "2", "-T", str(max(1, round(seconds))), "-f", script.name,
             database_url], capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    return float(re.search(r"^tps = ([\d.]+)", out, re.M).group(1))


def stored(database_url: str) -> int:
    import psycopg

    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT count(*) FROM notifications").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server", choices=["gunicorn", "granian", "granian-asgi", "uvicorn"], default="gunicorn")
    parser.add_argument("--asgi-app", choices=["project", "django"], default="project",
                        help="ASGI servers: the project's application or the API under another adapter")
    parser.add_argument("--extra-path", default=os.environ.get("BENCH_EXTRA_PATH", ""),
                        help="PYTHONPATH entry for the server (granian/uvicorn installed outside the venv)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-class", choices=["sync", "gthread"], default="sync")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--single-clients", type=int, default=8)
    parser.add_argument("--batch-clients", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--modes", default="single,batch")
    parser.add_argument("--keys", type=int, default=40000, help="distinct Idempotency-Keys a `keyed` run sends at most")
    parser.add_argument("--pgbench", action="store_true",
                        help="after each single/keyed run, pgbench one-row inserts, as many clients; the ratio")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw",
                        help="load generator: raw keep-alive sockets on one selector loop (default), or httpx threads")
    args = parser.parse_args()

    ensure_database(args.database_url)
    key = prepare(args.database_url, args.batch_size if "subscribers" in args.modes.split(",") else 0)
    port = free_port()
    server = start_gunicorn(args, port)
    try:  # the server stops whatever happens
        base = f"http://127.0.0.1:{port}/api/v1/notifications"
        path = "/api/v1/notifications"
        read_urls = []
        if "read" in args.modes.split(","):
            created = httpx.post(f"{base}/batch", json={"notifications": [EMAIL_ITEM] * 200},
                                 headers={"Authorization": f"Bearer {key}"}, timeout=60)  # fmt: skip
            created.raise_for_status()
            ids = [n["id"] for n in created.json()["results"]]
            read_urls = [f"{path}/{i}" for i in ids]
            import psycopg

            with psycopg.connect(args.database_url) as conn:  # two attempts each, as a retried send has
                conn.execute(
                    "INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at, "
                    "finished_at, outcome, error_class, error_code, error_message, http_status, duration_ms) "
                    "SELECT tenant_id, id, g, provider_id, now(), now(), 'transient_error', 'Timeout', 'timeout', '', "
                    "NULL, 12 FROM notifications, generate_series(1, 2) g WHERE id = ANY(%s::uuid[])", [ids]
                )
        modes = {
            "read": (read_urls, None, 1, args.single_clients),
            "single": (path, json.dumps(EMAIL_ITEM).encode(), 1, args.single_clients),
            "keyed": (path, json.dumps(EMAIL_ITEM).encode(), 1, args.single_clients),
            "batch": (f"{path}/batch", json.dumps({"notifications": [EMAIL_ITEM] * args.batch_size}).encode(),
                      args.batch_size, args.batch_clients),
            "subscribers": (f"{path}/batch", json.dumps({"notifications": [
                {**{k: v for k, v in EMAIL_ITEM.items() if k != "recipient"}, "subscriber": f"bench-{i}"}
                for i in range(args.batch_size)]}).encode(), args.batch_size, args.batch_clients),
        }  # fmt: skip
        results: dict[str, list[dict]] = {}
        before = stored(args.database_url)
        total = 0
        for _ in range(args.repeat):
            for mode in args.modes.split(","):
                url, body, per_request, clients = modes[mode]
                if mode == "keyed" and args.client != "raw":
                    raise SystemExit("--modes keyed needs --client raw")
                result = run_mode(port, url, key, body, per_request, clients, args.seconds, client=args.client,
                                  server_pid=server.pid, database_url=args.database_url,
                                  keys=args.keys if mode == "keyed" else 0)
                if mode != "read":
                    total += result["accepted"]
                if args.pgbench and mode in ("single", "keyed"):
                    result["pgbench_per_s"] = pgbench_rate(args.database_url, clients, args.seconds)
                    result["ratio"] = result["accepted_per_s"] / result["pgbench_per_s"]
                    print(f"pgbench: {result['pgbench_per_s']:9.0f} one-row inserts/s; {mode} / pgbench "
                          f"{result['ratio']:.3f}", flush=True)
                results.setdefault(mode, []).append(result)
                print(f"{mode:>6}: {result['accepted_per_s']:9.0f} accepted/s  p50 {result['p50_ms']:7.1f} ms  "
                      f"p99 {result['p99_ms']:7.1f} ms  requests {result['requests']}  statuses {result['statuses']}  "
                      f"CPU/request: server {result['server_us']:.0f} us, db {result['db_us']:.0f} us, "
                      f"client {result['client_us']:.0f} us", flush=True)
        in_db = stored(args.database_url) - before
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    kind = {"gunicorn": f"gunicorn {args.worker_class}", "granian": "granian wsgi",
            "granian-asgi": f"granian asgi ({args.asgi_app})", "uvicorn": f"uvicorn asgi ({args.asgi_app})"}
    threaded = args.server.startswith("granian") or args.worker_class == "gthread"
    threads = f" x {args.threads} threads" if threaded else ""
    print(f"\n{kind[args.server]}: {args.workers} workers{threads}, {os.cpu_count()} CPUs, "
          f"{args.seconds:g} s per run, median of {args.repeat}:")
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("accepted_per_s", "p50_ms", "p99_ms", "server_us", "db_us", "client_us")}  # fmt: skip
        path = {"single": "POST notifications", "keyed": "POST with Idempotency-Key",
                "batch": "POST notifications/batch", "subscribers": "POST batch by subscriber",
                "read": "GET notifications/{id}"}[mode]  # fmt: skip
        unit = "reads/s" if mode == "read" else "notifications/s"
        print(f"  {path:<26} {med['accepted_per_s']:9.0f} {unit:<16}"
              f"p50 {med['p50_ms']:7.1f} ms   p99 {med['p99_ms']:7.1f} ms   CPU/request: server "
              f"{med['server_us']:.0f} us, db {med['db_us']:.0f} us, client ({args.client}) {med['client_us']:.0f} us")
        if "ratio" in runs[0]:
            print(f"  {'':<26} ÷ pgbench one-row inserts in the same minute: median "
                  f"{statistics.median(r['ratio'] for r in runs):.3f} "
                  f"({', '.join(format(r['ratio'], '.3f') for r in runs)}; "
                  f"pgbench {statistics.median(r['pgbench_per_s'] for r in runs):.0f}/s)")
    print(f"  accepted {total}, stored {in_db}: {'OK' if total == in_db else 'MISMATCH'}")
    if total != in_db:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
