"""Bulk sends end to end: a CSV with bad rows refused, the fixed file sent once per row, and delivery
speed against the same count through the batch API.

    .venv/bin/python bench/bulk_bench.py [-n 100000] [--bad 37] [--kill] [--no-compare] [--database-url URL]

Real processes on loopback, on a database of their own (created and migrated, by default
`omnipost_bulk_bench`): the web server (granian, 1 worker, as the Procfile runs it), one scheduler,
two dispatchers, and `benchmarks.receiver` as the webhook provider's endpoint. Steps:

1. upload (multipart) a CSV of `-n` rows with `--bad` broken rows: it must come back `invalid`
   listing exactly those rows; the upload's time gives the CSV rows checked per second;
2. upload the fixed file (`ready`), start it, and wait until every row was delivered; with `--kill`,
   the scheduler creating its chunks, a dispatcher and the web process are each killed with SIGKILL
   once during the job, and started again;
3. check: the job `completed`, exactly one notification per row (rows 1..n), the receiver saw each
   notification once; and report `GET bulk-sends/{id}` (the progress counts) latency at n rows;
4. unless `--no-compare`: the same count through `POST notifications/batch` (1,000 a call) to a fresh
   receiver; delivered per second of both, from the first request to the last arrival.

Exits non-zero when a check fails. Figures on a shared machine move with its load.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.standalone import SETTINGS, create_database, setup_django, sql  # noqa: E402

DEFAULT_URL = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_bulk_bench"
WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Failed(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise Failed(what)
    print(f"  ok: {what}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    def __init__(self, env: dict[str, str], logs: Path, port: int) -> None:
        self.env, self.logs, self.port = env, logs, port
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str) -> None:
        kind = name.rstrip("0123456789")
        if kind == "web":
            command = ["granian", "--interface", "wsgi", "omnipost_site.wsgi:application", "--host", "127.0.0.1",
                       "--port", str(self.port), "--workers", "1", "--blocking-threads", "4", "--no-ws"]  # fmt: skip
            command[0] = str(Path(sys.executable).with_name("granian"))
        elif kind == "scheduler":
            command = [sys.executable, "manage.py", "run_scheduler", "--no-jitter", "--interval", "0.5"]
        else:
            command = [sys.executable, "manage.py", "run_dispatcher", "--no-jitter", "--batch-size", "200",
                       "--concurrency", "200"]  # fmt: skip
        with open(self.logs / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(  # noqa: S603
                command, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def kill(self, name: str) -> None:
        """SIGKILL to the process and its children (granian's worker)."""
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def request(port: int, key: str, method: str, path: str, body: bytes | None = None,
            content_type: str = "application/json") -> tuple[int, dict]:  # fmt: skip
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/{path}", data=body, method=method)  # noqa: S310
    req.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=300) as response:  # noqa: S310
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text or b"{}")
        except ValueError:
            return exc.code, {"body": text[:500].decode(errors="replace")}


def multipart(fields: dict[str, str], data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    out = io.BytesIO()
    for name, value in fields.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="list.csv"\r\n'
              "Content-Type: text/csv\r\n\r\n".encode())  # fmt: skip
    out.write(data)
    out.write(f"\r\n--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


def csv_bytes(rows: int, bad: set[int]) -> bytes:
    lines = ["recipient,name,code"]
    for row in range(1, rows + 1):
        if row in bad:  # alternately a recipient with a control character and a missing variable
            lines.append(f"user-{row}\x01,User {row},C{row}" if row % 2 else f"user-{row},User {row},")
        else:
            lines.append(f"user-{row},User {row},C{row}")
    return ("\n".join(lines) + "\n").encode()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def wait_http(port: int, timeout: float = 60.0) -> None:
    def up() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):  # noqa: S310
                return True
        except OSError:
            return False

    wait_until(up, timeout, "the web server")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/bulk_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--rows", type=int, default=100_000)
    parser.add_argument("--bad", type=int, default=37)
    parser.add_argument("--kill", action="store_true", help="SIGKILL the scheduler, a dispatcher and the web once")
    parser.add_argument("--no-compare", action="store_true", help="skip the batch API's run")
    parser.add_argument("--database-url", default=os.environ.get("BULK_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--logs", default="/tmp/omnipost-bulk-bench")  # noqa: S108
    args = parser.parse_args(argv)
    create_database(args.database_url)
    setup_django(args.database_url)
    from benchmarks.receiver import ReceiverProcess
    from core.models import ApiKey, Tenant
    from providers.models import Provider
    from templating.models import Template

    sql("TRUNCATE bulk_sends, bulk_send_chunks, notifications, queue_state, scheduled_jobs, tenants CASCADE")
    tenant = Tenant.objects.create(name="bulk-bench")
    key = ApiKey.issue(tenant, name="bench")[1]
    receiver = ReceiverProcess(verify_every=50, secret=WHSEC)
    Provider.objects.create(tenant=tenant, name="hook", kind="webhook", channel="webhook", is_default=True,
                                       config={"url": receiver.url, "timeout_seconds": 10},
                                       secrets={"signing_secret": WHSEC})  # fmt: skip
    Template.objects.create(tenant=tenant, key="notice", channel="webhook", subject="Notice for {{ name }}",
                            body="Hello {{ name }}, your code is {{ code }}.")  # fmt: skip
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": args.database_url, "DJANGO_SETTINGS_MODULE": SETTINGS,
           "OMNIPOST_LOG_LEVEL": "WARNING", "OMNIPOST_RATE_LIMIT_API": "1000000"}  # fmt: skip
    procs = Processes(env, logs, port)
    figures: dict[str, object] = {"rows": args.rows, "bad_rows": args.bad, "kill": args.kill}
    try:
        for name in ("web", "scheduler", "dispatcher1", "dispatcher2"):
            procs.start(name)
        wait_http(port)
        fields = {"channel": "webhook", "template": "notice", "name": "bench"}

        print(f"1. {args.rows:,} rows with {args.bad} bad ones", flush=True)
        bad = set(random.Random(44).sample(range(1, args.rows + 1), args.bad))
        body, content_type = multipart(fields, csv_bytes(args.rows, bad))
        started = time.perf_counter()
        status, job = request(port, key, "POST", "bulk-sends", body, content_type)
        seconds = time.perf_counter() - started
        check(status == 201 and job["status"] == "invalid", f"refused as invalid ({status}, {job.get('status')})")
        check(job["error_count"] == args.bad and sorted({e["row"] for e in job["errors"]}) == sorted(bad)[:100],
              f"its errors list exactly the {args.bad} bad rows")  # fmt: skip
        figures["invalid_upload_seconds"] = round(seconds, 2)
        figures["rows_checked_per_second"] = round(args.rows / seconds)

        print("2. the fixed file", flush=True)
        body, content_type = multipart(fields, csv_bytes(args.rows, set()))
        started = time.perf_counter()
        status, job = request(port, key, "POST", "bulk-sends", body, content_type)
        seconds = time.perf_counter() - started
        check(status == 201 and job["status"] == "ready", f"ready ({status}, {job.get('status')})")
        figures["ready_upload_seconds"] = round(seconds, 2)
        figures["rows_checked_and_stored_per_second"] = round(args.rows / seconds)
        job_id = job["id"]
        started_at = time.time()
        status, job = request(port, key, "POST", f"bulk-sends/{job_id}/start")
        check(status == 202 and job["status"] == "sending", "started")

        def delivered() -> int:
            return sql("SELECT count(*) FROM notifications WHERE bulk_send_id = %s AND status = 'delivered'",
                       [job_id])[0][0]  # fmt: skip

        def created() -> int:
            return sql("SELECT rows_done FROM bulk_sends WHERE id = %s", [job_id])[0][0]

        if args.kill:
            wait_until(lambda: created() >= args.rows // 4, 600, "a quarter of the rows created", 0.05)
            procs.kill("scheduler")
            print(f"  killed the scheduler at {created():,} rows created", flush=True)
            procs.start("scheduler")
            wait_until(lambda: delivered() >= args.rows // 3, 900, "a third delivered", 0.1)
            procs.kill("dispatcher1")
            print(f"  killed a dispatcher at {delivered():,} delivered", flush=True)
            procs.start("dispatcher1")
            wait_until(lambda: delivered() >= args.rows // 2, 900, "half delivered", 0.1)
            procs.kill("web")
            print(f"  killed the web process at {delivered():,} delivered", flush=True)
            procs.start("web")
            wait_http(port)
        timings: list[float] = []

        def all_delivered() -> bool:  # and the progress GET's latency while the job runs (every ~2 s)
            t0 = time.perf_counter()
            try:
                status, _ = request(port, key, "GET", f"bulk-sends/{job_id}")
            except OSError:
                status = 0  # the web process is restarting
            if status == 200:
                timings.append((time.perf_counter() - t0) * 1000)
            return delivered() >= args.rows

        wait_until(all_delivered, 1800, "every row delivered", 2.0)
        final, arrivals = receiver.stop()
        receiver = None
        last = max(arrivals.values())
        figures["bulk_delivered_per_second"] = round(args.rows / (last - started_at))
        status, job = request(port, key, "GET", f"bulk-sends/{job_id}")
        check(job["status"] == "completed", "completed")
        check(job["progress"] == {"created": args.rows, "delivered": args.rows, "failed": 0, "suppressed": 0,
                                  "pending": 0}, f"progress {job['progress']}")  # fmt: skip
        count, distinct, low, high = sql("SELECT count(*), count(DISTINCT bulk_row), min(bulk_row), max(bulk_row) "
                                         "FROM notifications WHERE bulk_send_id = %s", [job_id])[0]  # fmt: skip
        check((count, distinct, low, high) == (args.rows, args.rows, 1, args.rows), "exactly one notification a row")
        sends = f"{final['unique']:,} unique, {final['duplicates']} repeated sends"
        check(final["unique"] == args.rows and final["bad_signatures"] == 0, f"the receiver got each once ({sends})")
        figures["receiver_repeats"] = final["duplicates"]
        figures["progress_get_ms_while_running"] = {"median": round(statistics.median(timings), 1),
                                                    "max": round(max(timings), 1), "samples": len(timings)}  # fmt: skip
        t0 = time.perf_counter()
        request(port, key, "GET", f"bulk-sends/{job_id}")
        figures["progress_get_ms_finished"] = round((time.perf_counter() - t0) * 1000, 1)

        if not args.no_compare:
            print("3. the same count through the batch API", flush=True)
            receiver = ReceiverProcess(verify_every=50, secret=WHSEC)
            Provider.objects.create(tenant=tenant, name="hook2", kind="webhook", channel="webhook",
                                    config={"url": receiver.url, "timeout_seconds": 10},
                                    secrets={"signing_secret": WHSEC})  # fmt: skip
            started_at = time.time()
            for start in range(1, args.rows + 1, 1000):
                items = [{"channel": "webhook", "recipient": f"user-{row}", "template": "notice", "provider": "hook2",
                          "context": {"name": f"User {row}", "code": f"C{row}"}}
                         for row in range(start, min(args.rows, start + 999) + 1)]  # fmt: skip
                status, _ = request(
                    port, key, "POST", "notifications/batch", json.dumps({"notifications": items}).encode()
                )
                if status != 201:
                    raise Failed(f"a batch answered {status}")
            wait_until(
                lambda: (
                    sql("SELECT count(*) FROM notifications WHERE bulk_send_id IS NULL AND status = 'delivered'")[0][0]
                    >= args.rows
                ),
                1800,
                "the batches delivered",
                0.5,
            )
            final, arrivals = receiver.stop()
            receiver = None
            check(final["unique"] == args.rows, f"the batch API's {args.rows:,} delivered")
            figures["batch_api_delivered_per_second"] = round(args.rows / (max(arrivals.values()) - started_at))
    except Failed as exc:
        print(f"bulk_bench: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
        if receiver is not None:
            receiver.stop()
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
