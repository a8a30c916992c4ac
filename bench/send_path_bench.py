"""CPU per delivery of the dispatcher's send path alone, without the database.

    .venv/bin/python bench/send_path_bench.py [-n 50000] [--concurrency 500] [--batch 250] [--repeat 3] [--routing]

Runs `Dispatcher._start_send` (recipient decryption, payload, signature, HTTP request through the
pooled client, response parsing, outcome) for n prepared items against the bench receiver in
another process, `batch` items at a time with at most `concurrency` in flight, and reports this
process's CPU microseconds per delivery (`time.process_time`): the dispatcher's share of the
end-to-end cost minus its two SQL statements per batch. CPU time, not throughput, so that changes
can be compared on a machine shared with other work.

`--routing` adds what failover costs the claim side in memory: the items name no provider, and each
claimed batch goes through `routing.failover.Router.route` with two providers in failover order and
the second one's breaker open (the database half of breaker bookkeeping is the record statement's,
measured end to end by `bench/versus.py --failover`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")
# as `omnipost_bench` runs its dispatchers (benchmarks.runner.dispatcher_env)
os.environ.update(DEBUG="false", OMNIPOST_ALLOW_PRIVATE_DESTINATIONS="true", OMNIPOST_LOG_LEVEL="WARNING")
os.environ.setdefault("SECRET_KEY", "omnipost-bench-only")
os.environ.setdefault("OMNIPOST_ENCRYPTION_KEYS", "x8ROxZ3gJ9D2CFFGZuxGvUQoLhPn7cVeLBcLd2R9s0c=")


TENANT = uuid.uuid4()


def items(count: int, provider_id: int, *, named: bool = True) -> list:
    from core import crypto
    from dispatch.delivery import DispatchLease, Prepared

    now = datetime.now(UTC)
    tenant = TENANT
    token = crypto.encrypt("https://example.test/bench-hook")
    prepared = []
    for i in range(count):
        nid = uuid.uuid4()
        lease = DispatchLease(i, uuid.uuid4(), provider_id, False, str(nid), str(tenant))
        prepared.append(
            Prepared(lease, "webhook", token, "Bench notification", "x" * 120, {"bench": True}, now, 1, 1,
                     provider_named=named)
        )
    return prepared


async def run(args: argparse.Namespace, url: str) -> float:
    from benchmarks.runner import SIGNING_SECRET
    from core.crypto import decrypt_many
    from dispatch.dispatcher import Dispatcher, DispatcherConfig
    from dispatch.providers import CachedProvider
    from providers.kinds import build_provider

    dispatcher = Dispatcher(DispatcherConfig(concurrency=args.concurrency, batch_size=args.batch, jitter=False))
    dispatcher.bind(asyncio.get_running_loop())
    provider = build_provider("webhook", {"url": url}, {"signing_secret": SIGNING_SECRET})
    dispatcher.providers.entries[1] = CachedProvider(provider, datetime.now(UTC), 5, False, time.monotonic())
    work = items(args.n, 1, named=not args.routing)
    router = None
    if args.routing:
        from providers.circuit import OPEN
        from routing.failover import Router

        router = Router()
        router.orders = {(str(TENANT), "webhook"): [1, 2]}
        router.position = {1: (str(TENANT), "webhook"), 2: (str(TENANT), "webhook")}
        router.states = {2: OPEN}
    warm = items(args.concurrency, 1)
    for item in warm:  # connections opened, caches warm
        dispatcher.sender.start(item)
    while dispatcher.sender.inflight:
        await asyncio.sleep(0.01)
    dispatcher.recorder.pending.clear()
    gc.collect()
    gc.freeze()
    started = time.process_time()
    position = 0
    while position < len(work) or dispatcher.sender.inflight:
        free = args.concurrency - len(dispatcher.sender.inflight)
        if free >= args.batch and position < len(work):
            claimed = work[position : position + args.batch]
            if router is not None:
                claimed = router.route(claimed, dict).send
            for item, opened in zip(claimed, decrypt_many([p.recipient_token for p in claimed]), strict=True):
                item.opened_recipient = opened  # as claim_and_start does
            for item in claimed:
                dispatcher.sender.start(item)
            position += args.batch
            continue
        dispatcher.sender.capacity.clear()
        await dispatcher.sender.capacity.wait()
        if len(dispatcher.recorder.pending) >= args.batch:
            dispatcher.recorder.pending.clear()  # recorded, as far as this bench goes
    spent = time.process_time() - started
    await provider.aclose()
    return spent / args.n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50000)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--batch", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--routing", action="store_true", help="route each batch through a failover order")
    args = parser.parse_args()

    import django

    django.setup()
    from benchmarks.receiver import ReceiverProcess
    from benchmarks.runner import SIGNING_SECRET

    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    figures = []
    for _ in range(args.repeat):
        receiver = ReceiverProcess(secret=SIGNING_SECRET)
        try:
            figures.append(runner(run(args, receiver.url)))
        finally:
            final, _ = receiver.stop()
        assert final["bad_signatures"] == 0 and final["unique"] >= args.n, final
        print(f"{figures[-1]:.1f} µs CPU per delivery", flush=True)
    median = statistics.median(figures)
    print(f"median of {args.repeat}: {median:.1f} µs CPU per delivery in the dispatcher's send path")


if __name__ == "__main__":
    main()
