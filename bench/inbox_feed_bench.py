"""The inbox's feed pages and counts at scale: the time PostgreSQL spends on each request of the
subscriber's API for a subscriber with 1,000,000 items and for one with a single item, in a table of
10,000,000 items (the rest one each for as many other subscribers of the same tenant).

    .venv/bin/python bench/inbox_feed_bench.py [--rows 10000000] [--big 1000000] [--repeats 5]
        [--refill] [--database-url URL]

Each request goes through the real view (`/inbox/v1/…` with an inbox token, Django's test client);
every SELECT it ran is run again under EXPLAIN (ANALYZE, BUFFERS), and the figure is the sum of their
execution times (median of `--repeats`), with the rows the plans read and the pages they touched.
The big subscriber's items span a year: 70 % read, 80 % seen, 5 % archived; 94 % in category
`general`, 5 % `news`, 1 % `billing`. The target is ≤ 5 ms each in the database.

Uses (creates, migrates and fills once; `--refill` fills again) its own database, by default
`omnipost_inbox_bench`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.standalone import create_database, setup_django, sql  # noqa: E402

DEFAULT_URL = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_inbox_bench"
TENANT = "inbox-bench"
BIG, SMALL = "sub-big", "sub-1"
CHUNK = 1_000_000


def fill(rows: int, big: int, refill: bool) -> Any:  # noqa: ANN401
    """The tenant and its items (kept between runs unless `refill` or the sizes changed)."""
    from core.models import Tenant

    tenant = Tenant.objects.filter(name=TENANT).first()
    present = sql("SELECT count(*) FROM inbox_items")[0][0] if tenant else 0
    if tenant and present == rows and not refill:
        return tenant
    sql("TRUNCATE inbox_items, inbox_counts")
    Tenant.objects.filter(name=TENANT).delete()
    tenant = Tenant.objects.create(name=TENANT)
    started = time.monotonic()
    for low in range(1, rows + 1, CHUNK):
        high = min(rows, low + CHUNK - 1)
        sql(
            """
            INSERT INTO inbox_items (id, tenant_id, subscriber, notification_id, category, title, body, data,
                                     action_url, created_at, seen_at, read_at, first_read_at, archived_at)
            SELECT gen_random_uuid(), %(tenant)s, CASE WHEN g <= %(big)s THEN %(name)s ELSE 'sub-' || (g - %(big)s) END,
                   gen_random_uuid(),
                   CASE WHEN g %% 100 = 0 THEN 'billing' WHEN g %% 100 < 6 THEN 'news' ELSE 'general' END,
                   'Item ' || g, 'body', '{}', '', at,
                   CASE WHEN g %% 10 < 8 THEN at END, CASE WHEN g %% 10 < 7 THEN at END,
                   CASE WHEN g %% 10 < 7 THEN at END, CASE WHEN g %% 20 = 7 THEN at END
            FROM (SELECT g, now() - (g %% %(big)s) * (interval '365 days' / %(big)s) AS at
                  FROM generate_series(%(low)s, %(high)s) AS g) AS s
            """,
            {"tenant": tenant.pk, "big": big, "name": BIG, "low": low, "high": high},
        )
        print(f"# {high:,} of {rows:,} items in {time.monotonic() - started:.0f} s", flush=True)
    from inbox import statements
    from recipients.models import Subscriber

    for subscriber in (BIG, SMALL):  # the two the bench asks as (a token names an existing subscriber)
        Subscriber.objects.create(tenant=tenant, external_id=subscriber)
        statements.recount(tenant.pk, subscriber)
    sql("VACUUM ANALYZE inbox_items")
    return tenant


def explain(statement: str, params: Any) -> tuple[float, int, int]:  # noqa: ANN401
    """(execution ms, rows read by the plan's scans, shared pages touched) of one statement."""
    plan = sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)[0][0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    read = 0

    def walk(node: dict) -> None:
        nonlocal read
        if "Scan" in node["Node Type"]:
            read += (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node.get("Actual Loops", 1)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    top = plan[0]["Plan"]
    return plan[0]["Execution Time"], read, top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


def measure(client: Any, path: str, token: str, repeats: int) -> dict[str, Any]:  # noqa: ANN401
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")
    if response.status_code != 200:
        raise SystemExit(f"{path}: HTTP {response.status_code} {response.content[:200]!r}")
    selects = [(q["sql"], None) for q in captured.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    runs = []
    for _ in range(repeats):
        figures = [explain(statement, params) for statement, params in selects]
        runs.append((sum(f[0] for f in figures), sum(f[1] for f in figures), sum(f[2] for f in figures)))
    body = response.json()
    page = body if isinstance(body, dict) else {}
    return {
        "ms": statistics.median(r[0] for r in runs), "rows_read": runs[-1][1], "pages": runs[-1][2],
        "statements": len(selects), "items": len(page.get("results", [])), "next": page.get("next"),
    }  # fmt: skip


def line(subscriber: str, label: str, result: dict[str, Any]) -> str:
    return (f"{subscriber:<10} {label:<26} {result['ms']:>7.2f} {result['statements']:>5} "
            f"{result['rows_read']:>9,} {result['pages']:>6,} {result['items']:>5}")  # fmt: skip


def local(link: str) -> str:
    """A `next` link as the test client asks for it (path and query)."""
    parts = urlsplit(link)
    return f"{parts.path}?{parts.query}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/inbox_feed_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--refill", action="store_true")
    parser.add_argument("--database-url", default=DEFAULT_URL)
    args = parser.parse_args(argv)
    if not 0 < args.big < args.rows:
        parser.error("--big must be between 1 and --rows")
    create_database(args.database_url)
    setup_django(args.database_url)
    from django.conf import settings
    from django.test import Client

    from inbox import tokens

    settings.ALLOWED_HOSTS = ["*"]
    tenant = fill(args.rows, args.big, args.refill)
    client = Client()
    cases = ["feed", "feed?status=unread", "feed?status=unseen", "feed?status=archived", "feed?category=news",
             "feed?category=billing", "counts"]  # fmt: skip
    print(f"inbox_items: {args.rows:,} rows; {BIG}: {args.big:,} items; {SMALL}: 1 item; median of {args.repeats}")
    print(f"{'subscriber':<10} {'request':<26} {'db ms':>7} {'stmts':>5} {'rows read':>9} {'pages':>6} {'items':>5}")
    for subscriber in (BIG, SMALL):
        token, _ = tokens.issue(tenant.pk, subscriber, 3600)
        for case in cases:
            result = measure(client, f"/inbox/v1/{case}", token, args.repeats)
            print(line(subscriber, case, result))
            if case == "feed" and result["next"]:
                deeper = result["next"]
                for _ in range(3):  # a page reached by following `next`: the cursor's keyset probe
                    deeper = measure(client, local(deeper), token, 1)["next"] or deeper
                print(line(subscriber, "feed, 5th page (cursor)", measure(client, local(deeper), token, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
