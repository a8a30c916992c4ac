"""The console, `GET queues` and `/metrics` at a million notifications: page times, median of 5.

    .venv/bin/python bench/console_bench.py [--database-url URL] [--rows 1000000] [--repeat 5] [--workers 2]
        [--refill]

Fills its own database (default `omnipost_console_bench`, created if absent; filled once, reused while
it holds `--rows` notifications) with batch INSERT … SELECT statements: two tenants (three rows in four
tenant A's) over 30 days, 70 % delivered (each with its attempt), a live backlog of 20 % queued and 3 %
retrying (230,000 queue items, so the queue figures take their sampled path), and failed, dead-lettered
(each with a DLQ entry, one in five still open), cancelled and scheduled ones. Then VACUUM ANALYZE, as
autovacuum would have. Serves the admin and the API with gunicorn (`--workers` sync workers, DEBUG off),
logs in as a superuser and as a staff member of tenant A (`create_staff_user`), and times each page
(after one warm-up request) `--repeat` times; prints the median, the spread and the target per page.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest_bench import ensure_database, free_port, server_env  # noqa: E402

DEFAULT_DB = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_console_bench"
PASSWORD = "bench-Console-Pa55word"
BATCH = 100_000
# (status, per 100 rows)
MIX = [("delivered", 70), ("queued", 20), ("retrying", 3), ("failed", 2), ("dead_lettered", 2),
       ("cancelled", 2), ("scheduled", 1)]  # fmt: skip
ADMIN_TARGET_MS, API_TARGET_MS = 300, 50


def setup_django(database_url: str) -> None:
    os.environ.update(server_env(database_url))
    import django

    django.setup()


def fill(rows: int, refill: bool) -> dict[str, str]:
    """The data set (reused when already there); returns the ids the pages need."""
    from django.db import connection

    from core.models import ApiKey, Tenant
    from notifications.models import Notification
    from providers.models import Provider

    tenants = {t.name: t for t in Tenant.objects.filter(name__in=["bench-a", "bench-b"])}
    present = Notification.objects.count() if len(tenants) == 2 else 0
    if refill or present < rows:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE queue_state, scheduled_jobs, delivery_attempts, dead_letter_queue, "
                           "idempotency_records, notifications CASCADE")  # fmt: skip
        Provider.objects.filter(tenant__name__in=["bench-a", "bench-b"]).delete()
        Tenant.objects.filter(name__in=["bench-a", "bench-b"]).delete()
        tenants = {name: Tenant.objects.create(name=name) for name in ("bench-a", "bench-b")}
        providers = {
            name: Provider.objects.create(tenant=t, name="hook", kind="console", channel="webhook", is_default=True)
            for name, t in tenants.items()
        }
        token = Notification._meta.get_field("recipient").get_prep_value("https://example.test/hook")
        cases = " ".join(
            f"WHEN g %% 100 < {sum(n for _, n in MIX[: i + 1])} THEN '{status}'" for i, (status, _) in enumerate(MIX)
        )
        a, b = tenants["bench-a"], tenants["bench-b"]
        started = time.monotonic()
        for first in range(1, rows + 1, BATCH):
            last = min(rows, first + BATCH - 1)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"""
                    INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id,
                        context, subject, body, priority, queue, status, metadata, attempt_count, attempt_offset,
                        last_error_code, created_at, updated_at, delivered_at)
                    SELECT gen_random_uuid(), CASE WHEN g %% 4 = 0 THEN %s ELSE %s END, 'webhook', %s, 'h***',
                           CASE WHEN g %% 4 = 0 THEN %s ELSE %s END, '{{}}', 's', 'b', g %% 10,
                           CASE WHEN g %% 7 = 0 THEN 'bulk' ELSE 'default' END, CASE {cases} END, '{{}}', 1, 0, '',
                           now() - (g * interval '2.6 seconds'), now(), NULL
                    FROM generate_series(%s, %s) AS g
                    """,  # noqa: S608 - the CASE is built from the constants above
                    [b.pk, a.pk, token, providers["bench-b"].pk, providers["bench-a"].pk, first, last],
                )
            print(f"  notifications {last:,}/{rows:,} ({time.monotonic() - started:.0f} s)", flush=True)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE notifications SET delivered_at = created_at + interval '1 second' "
                           "WHERE status = 'delivered'")  # fmt: skip
            cursor.execute(
                """
                INSERT INTO delivery_attempts (tenant_id, notification_id, number, provider_id, started_at,
                    finished_at, outcome, error_class, error_code, error_message, duration_ms)
                SELECT tenant_id, id, 1, provider_id, created_at, created_at + interval '40 ms',
                       CASE WHEN status = 'delivered' THEN 'delivered' ELSE 'transient_error' END, '', '', '', 40
                FROM notifications WHERE status IN ('delivered', 'retrying', 'dead_lettered', 'failed')
                """
            )
            cursor.execute(
                """
                INSERT INTO queue_state (queue_name, priority, payload_json, enqueued_at, available_at, attempts,
                                         tenant_id, notification_id, provider_id, rate_limited, ready)
                SELECT queue, priority, '{}'::jsonb, created_at,
                       CASE WHEN status = 'retrying' THEN now() + interval '1 hour' ELSE created_at END, 0,
                       tenant_id, id, provider_id, false, status = 'queued'
                FROM notifications WHERE status IN ('queued', 'retrying')
                """
            )
            cursor.execute(
                """
                INSERT INTO dead_letter_queue (id, notification_id, tenant_id, provider_id, failure_reason,
                    failure_class, error_code, last_status_code, attempt_count, status, created_at, resolved_by)
                SELECT gen_random_uuid(), id, tenant_id, provider_id, 'HTTP 503', 'transient', 'http_503', 503, 8,
                       CASE WHEN random() < 0.8 THEN 'redriven' ELSE 'open' END, created_at, ''
                FROM notifications WHERE status = 'dead_lettered'
                """
            )
        print(f"  filled in {time.monotonic() - started:.0f} s; VACUUM ANALYZE …", flush=True)
        connection.close()
        import psycopg

        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            for table in ("notifications", "delivery_attempts", "queue_state", "dead_letter_queue"):
                conn.execute(f"VACUUM ANALYZE {table}")
    a = tenants["bench-a"]
    failed = Notification.objects.filter(tenant=a, status="failed").order_by("-created_at").values_list("pk", flat=True)
    key = ApiKey.issue(a, name=f"console-bench-{int(time.time())}")[1]
    return {"tenant_a": str(a.pk), "failed_id": str(failed.first()), "api_key": key}


def users() -> None:
    from django.contrib.auth import get_user_model

    User = get_user_model()  # noqa: N806
    if not User.objects.filter(username="bench-root").exists():
        User.objects.create_superuser("bench-root", "root@example.test", PASSWORD)
    env = server_env(os.environ["DATABASE_URL"])
    subprocess.run([sys.executable, "manage.py", "create_staff_user", "bench-staff", "--tenant", "bench-a",
                    "--password-stdin"], cwd=ROOT, env=env, input=PASSWORD + "\n", text=True, check=True,
                   capture_output=True)  # fmt: skip


def start_gunicorn(database_url: str, workers: int, port: int) -> subprocess.Popen:
    command = [str(Path(sys.executable).with_name("gunicorn")), "omnipost_site.wsgi:application", "--workers",
               str(workers), "--bind", f"127.0.0.1:{port}", "--timeout", "120", "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, env=server_env(database_url))  # noqa: S603
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("gunicorn did not come up")


def logged_in(base: str, username: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=60, follow_redirects=False)
    page = client.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    response = client.post("/admin/login/?next=/admin/", data={"username": username, "password": PASSWORD,
                           "csrfmiddlewaretoken": token, "next": "/admin/"},
                           headers={"Referer": f"{base}/admin/login/"})  # fmt: skip
    assert response.status_code == 302, (username, response.status_code)
    return client


def timed(client: httpx.Client, path: str, repeat: int, headers: dict | None = None) -> list[float]:
    first = client.get(path, headers=headers)  # warm-up (connection, caches, the worker's imports)
    assert first.status_code == 200, (path, first.status_code)
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(path, headers=headers)
        out.append(1000 * (time.perf_counter() - started))
        assert response.status_code == 200, (path, response.status_code)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--refill", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not urlsplit(args.database_url).path.lstrip("/").startswith("omnipost_console_bench"):
        raise SystemExit("the bench empties its database: name it omnipost_console_bench…")

    ensure_database(args.database_url)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT,
                   env=server_env(args.database_url), check=True)  # fmt: skip
    setup_django(args.database_url)
    ids = fill(args.rows, args.refill)
    users()
    from django.db import connection

    connection.close()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_gunicorn(args.database_url, args.workers, port)
    deep = 200 if args.rows >= 50_000 else 2  # the staff member's tenant needs 20,000 rows for page 200
    pages = [
        ("changelist", "/admin/notifications/notification/"),
        ("search by id", f"/admin/notifications/notification/?q={ids['failed_id']}"),
        ("status=failed", "/admin/notifications/notification/?status=failed"),
        (f"page {deep}", f"/admin/notifications/notification/?p={deep}"),
        ("DLQ list", "/admin/dlq/deadletter/"),
        ("dashboard", "/admin/dashboard/"),
    ]
    results = []
    try:
        for role, username in (("superuser", "bench-root"), ("staff", "bench-staff")):
            client = logged_in(base, username)
            for name, path in pages:
                ms = timed(client, path, args.repeat)
                results.append({"role": role, "page": name, "path": path, "ms": ms, "target_ms": ADMIN_TARGET_MS})
        api = httpx.Client(base_url=base, timeout=60)
        auth = {"Authorization": f"Bearer {ids['api_key']}"}
        results.append({"role": "tenant key", "page": "GET /api/v1/queues", "path": "/api/v1/queues",
                        "ms": timed(api, "/api/v1/queues", args.repeat, auth), "target_ms": API_TARGET_MS})  # fmt: skip
        results.append({"role": "scraper", "page": "GET /metrics", "path": "/metrics",
                        "ms": timed(api, "/metrics", args.repeat), "target_ms": API_TARGET_MS})  # fmt: skip
    finally:
        server.terminate()
        server.wait(30)
    if args.json:
        print(json.dumps(results, indent=2))
    print(f"\n{args.rows:,} notifications, gunicorn {args.workers} sync workers, median of {args.repeat}")
    print(f"{'role':<11} {'page':<20} {'median':>9} {'min':>8} {'max':>8}  target")
    for r in results:
        median = statistics.median(r["ms"])
        ok = "ok" if median < r["target_ms"] else "MISSED"
        print(f"{r['role']:<11} {r['page']:<20} {median:>7.1f}ms {min(r['ms']):>6.1f}ms {max(r['ms']):>6.1f}ms"
              f"  < {r['target_ms']} ms {ok}")


if __name__ == "__main__":
    main()
