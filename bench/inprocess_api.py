"""The hot path's CPU a request, in process: the WSGI application called directly, no server.

    .venv/bin/python bench/inprocess_api.py [--database-url URL] [--mode create|keyed|read|batch] [-n 2000]
        [--repeat 3]

Prepares the database as `bench/ingest_bench.py` does (its throwaway `omnipost_bench_ingest` by
default: migrated, notification tables emptied, a tenant with a console email provider and a key),
then calls `omnipost_site.wsgi.application` with a plain single create (`POST /api/v1/notifications`,
bench/ingest_bench.py's item), the same create with an `Idempotency-Key` of its own (`keyed`), a
detail read of one notification or a batch of `--batch-size` of
those items (`POST /api/v1/notifications/batch`: the figures are then a request's, not an item's),
`-n` times per run, after 200 warm-up calls (5 for batches). Prints CPU (`time.process_time`:
this process's threads, the ringer's included, not PostgreSQL's) and wall time a call, per run and
their median. One thread, so no statement is shared: this measures the code path, not concurrency
(bench/ingest_bench.py does that).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgres://postgres:postgres@127.0.0.1:5432/omnipost_bench_ingest")
    parser.add_argument("--mode", choices=["create", "keyed", "read", "batch"], default="create")
    parser.add_argument("--batch-size", type=int, default=1000, help="--mode batch: items a request")
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.chdir(ROOT)

    import ingest_bench

    ingest_bench.ensure_database(args.database_url)
    key = ingest_bench.prepare(args.database_url)
    import orjson

    from omnipost_site.wsgi import application

    status: list[str] = []

    def call(method: str, path: str, body: bytes = b"", **extra: str) -> bytes:
        environ = {**extra,
            "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/json", "HTTP_HOST": "127.0.0.1", "HTTP_AUTHORIZATION": f"Bearer {key}",
        }  # fmt: skip
        response = application(environ, lambda s, headers, exc=None: status.append(s))
        try:
            return b"".join(response)
        finally:
            response.close()  # request_finished, as a server sends it

    create_body = orjson.dumps(ingest_bench.EMAIL_ITEM)
    batch_body = orjson.dumps({"notifications": [ingest_bench.EMAIL_ITEM] * args.batch_size})
    first = call("POST", "/api/v1/notifications", create_body)
    if not status[-1].startswith("201"):
        sys.exit(f"inprocess_api: the create was answered {status[-1]}: {first[:200]!r}")
    detail = f"/api/v1/notifications/{orjson.loads(first)['id']}"

    run_id, keys = os.urandom(6).hex(), iter(range(10**9))

    def one() -> None:
        if args.mode == "create":
            call("POST", "/api/v1/notifications", create_body)
        elif args.mode == "keyed":  # a new key each call: never a replay
            call("POST", "/api/v1/notifications", create_body, HTTP_IDEMPOTENCY_KEY=f"bench-{run_id}-{next(keys)}")
        elif args.mode == "batch":
            call("POST", "/api/v1/notifications/batch", batch_body)
        else:
            call("GET", detail)

    for _ in range(200 if args.mode != "batch" else 5):
        one()
    cpu, wall = [], []
    for run in range(args.repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(args.n):
            one()
        cpu.append(1e6 * (time.process_time() - c0) / args.n)
        wall.append(1e6 * (time.perf_counter() - w0) / args.n)
        print(f"run {run + 1}: {args.mode} {cpu[-1]:.0f} µs CPU, {wall[-1]:.0f} µs wall a call ({status[-1]})")
    print(f"{args.mode}, median of {args.repeat} runs of {args.n}: "
          f"{statistics.median(cpu):.0f} µs CPU, {statistics.median(wall):.0f} µs wall a call")  # fmt: skip


if __name__ == "__main__":
    main()
