"""The live inbox stream (inbox.live): open streams one web process holds, and commit → event latency.

    .venv/bin/python bench/inbox_stream_bench.py [--streams 2000] [--latency-streams 200] [--rate 1000]
        [--seconds 10] [--database-url URL]

One granian ASGI worker (`omnipost_site.asgi`, as a deployment of the stream runs it) on loopback,
with `--backpressure` above `--streams` (granian's default, backlog / workers, is 1,024 requests
in flight a worker: an open stream is one, so past it new streams wait unanswered in the backlog);
`--streams` subscribers of one tenant, each with a token and an open stream (asyncio sockets in
this process, each counted once its first `counts` event arrived). Printed: how many opened, the
worker's RSS before and with them open, and per stream.

Then `--rate` items a second for `--seconds` to the first `--latency-streams` subscribers, written as
the dispatcher writes them: the record statement's inbox CTEs (inbox.statements.deliver_ctes), one
statement per batch of 20 ms, autocommit. Latency is from the moment that statement's commit
returned to the writer to the moment the item's event was parsed by its stream's reader: p50, p99
and max over every item; any item not received or received twice fails the run.

The writer, the readers and the server share this machine's cores; uses (creates, migrates,
overwrites) its own database, by default `omnipost_inbox_bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.standalone import create_database, setup_django  # noqa: E402

DEFAULT_URL = "postgres://postgres:postgres@127.0.0.1:5432/omnipost_inbox_bench"


def _setup(url: str) -> None:
    create_database(url)
    setup_django(url)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _worker_pid(parent: int) -> int:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    assert children, "granian has no worker"
    return int(children[0])


def _seed(count: int) -> tuple[uuid.UUID, list[str], list[str]]:
    from core.models import Tenant
    from inbox import tokens
    from recipients.models import Subscriber

    tenant = Tenant.objects.create(name=f"inbox-bench-{time.time_ns()}")
    names = [f"s{n}" for n in range(count)]
    Subscriber.objects.bulk_create([Subscriber(tenant=tenant, external_id=name) for name in names], batch_size=1000)
    return tenant.pk, names, [tokens.issue(tenant.pk, name, 7200)[0] for name in names]


class Reader:
    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.opened = asyncio.Event()
        self.items: list[tuple[str, float]] = []

    async def run(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(f"GET /inbox/v1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.token}\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())  # fmt: skip
        kind = None
        while line := await reader.readline():
            text = line.decode().strip()
            if text.startswith("event: "):
                kind = text[7:]
            elif text.startswith("data: ") and kind == "counts":
                self.opened.set()
            elif text.startswith("data: ") and kind == "item":
                self.items.append((json.loads(text[6:])["title"], time.time()))


def _writer(url: str, tenant_id: uuid.UUID, names: list[str], rate: int, seconds: float,
            committed: dict[str, float]) -> None:  # fmt: skip
    import psycopg

    from inbox.statements import deliver_ctes

    sql = f"""
        WITH changed AS (
            SELECT %(tenant)s::uuid AS tenant_id, n AS notification_id, 'in_app'::text AS channel,
                   'delivered'::text AS status, s AS inbox_subscriber, 'general'::text AS inbox_category,
                   n::text AS inbox_title, 'bench'::text AS inbox_body, '{{}}'::jsonb AS inbox_fields
            FROM unnest(%(ids)s::uuid[], %(subs)s::text[]) AS u(n, s)
        ), {deliver_ctes("changed")}
        SELECT count(*) FROM inbox_new"""  # noqa: S608
    tick = 0.02
    per_tick = max(1, round(rate * tick))
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < seconds:
            ids = [str(uuid.uuid4()) for _ in range(per_tick)]
            conn.execute(sql, {"tenant": tenant_id, "ids": ids, "subs": [random.choice(names) for _ in ids]})
            now = time.time()
            for each in ids:
                committed[each] = now
            n += 1
            pause = start + n * tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)


async def _main(args: argparse.Namespace, tenant_id: uuid.UUID, names: list[str], tokens_: list[str]) -> dict:
    from tests.support.pgserver import free_port

    port = free_port()
    env = {**os.environ, "OMNIPOST_LOG_LEVEL": "WARNING", "OMNIPOST_PUBLIC_URL": f"http://127.0.0.1:{port}"}
    server = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "granian", "--interface", "asgi", "omnipost_site.asgi:application", "--host",
         "127.0.0.1", "--port", str(port), "--workers", "1", "--no-ws", "--backlog", "4096",
         "--backpressure", str(args.streams + 100),
         "--log-level", "warning"], cwd=ROOT, env=env)  # fmt: skip
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "granian did not come up"
            await asyncio.sleep(0.2)
        worker = _worker_pid(server.pid)
        rss_before = _rss_kib(worker)
        readers = [Reader(port, token) for token in tokens_]
        tasks = []
        started = time.monotonic()
        for n, reader in enumerate(readers):
            tasks.append(asyncio.create_task(reader.run()))
            if n % 100 == 99:  # a burst of 100 connections at a time
                await asyncio.sleep(0.05)
        await asyncio.wait_for(asyncio.gather(*(r.opened.wait() for r in readers)), 300)
        open_seconds = time.monotonic() - started
        await asyncio.sleep(2)
        rss_open = _rss_kib(worker)
        dead = sum(t.done() for t in tasks)

        committed: dict[str, float] = {}
        chosen = names[: args.latency_streams]
        thread = threading.Thread(target=_writer, args=(os.environ["DATABASE_URL"], tenant_id, chosen, args.rate,
                                                        args.seconds, committed))  # fmt: skip
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.1)
        deadline = time.monotonic() + 30
        received: dict[str, float] = {}
        while time.monotonic() < deadline:
            received = {}
            dupes = 0
            for reader in readers[: args.latency_streams]:
                for title, at in reader.items:
                    dupes += title in received
                    received[title] = at
            if len(received) >= len(committed):
                break
            await asyncio.sleep(0.2)
        rss_after = _rss_kib(worker)
        latencies = sorted((received[k] - committed[k]) * 1000 for k in committed if k in received)
        for task in tasks:
            task.cancel()
        q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
        return {
            "streams_requested": args.streams, "streams_open": sum(r.opened.is_set() for r in readers),
            "streams_ended_early": dead, "open_seconds": round(open_seconds, 1),
            "worker_rss_mib_before": round(rss_before / 1024, 1), "worker_rss_mib_open": round(rss_open / 1024, 1),
            "rss_kib_per_stream": round((rss_open - rss_before) / max(1, args.streams), 1),
            "worker_rss_mib_after_load": round(rss_after / 1024, 1),
            "items_written": len(committed), "items_received": len(received), "duplicates": dupes,
            "write_rate_per_s": round(len(committed) / args.seconds),
            "latency_ms_p50": round(q[49], 1), "latency_ms_p99": round(q[98], 1),
            "latency_ms_max": round(latencies[-1], 1) if latencies else None,
        }  # fmt: skip
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--latency-streams", type=int, default=200)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--database-url", default=os.environ.get("INBOX_BENCH_DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args()
    _setup(args.database_url)
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.streams + 1024)), hard))
    result = asyncio.run(_main(args, *_seed(args.streams)))
    print(json.dumps(result, indent=2))
    ok = result["items_received"] == result["items_written"] and not result["duplicates"]
    sys.exit(0 if ok and result["streams_open"] == args.streams else 1)


if __name__ == "__main__":
    main()
