"""CPU per send of each push provider kind's send path alone, without the database or the dispatcher.

    .venv/bin/python bench/push_send_bench.py [-n 3000] [--concurrency 100] [--repeat 5]
        [--kinds webhook,webhook-hypercorn,apns,fcm,webpush] [--devices K]

Sends `n` messages through one provider of each kind (`start_send` where the kind has it, else
`send` in a task, as the dispatcher does) to its stand-in (benchmarks/push_standins.py; the webhook kind
to tests.support.receivers.HttpReceiver; `webhook-hypercorn`: the webhook kind to a hypercorn server
like the stand-ins', whose answers come in other batches and writes), at most `concurrency` in flight,
and prints the CPU microseconds per send of the event loop's thread (`time.thread_time`: the stand-ins run in threads
of their own and are not counted), median of `repeat` rounds after one warm-up round, with the
garbage collector set as the dispatcher sets it (dispatch.gc_tuning). The providers'
share of bench/push_bench.py's dispatcher CPU per send; CPU, not throughput, so changes can be
compared on a machine shared with other work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")
os.environ.update(DEBUG="false", OMNIPOST_ALLOW_PRIVATE_DESTINATIONS="true", OMNIPOST_LOG_LEVEL="WARNING")
os.environ.setdefault("SECRET_KEY", "omnipost-bench-only")
os.environ.setdefault("OMNIPOST_ENCRYPTION_KEYS", "x8ROxZ3gJ9D2CFFGZuxGvUQoLhPn7cVeLBcLd2R9s0c=")


class _Child:
    """A server running in a forked child process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


def _start(server: object, stack: list, processes: bool) -> None:
    """`server.start()`, here (its threads share this process's GIL with the loop measured) or, with
    `processes`, in a forked child: what this process then holds is the server's address (its port),
    for the provider's config."""
    if not processes:
        stack.append(server.start())
        return
    from benchmarks.push_standins import AsgiServer

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: serves until killed
        try:
            server.start()
            port = server.port if not hasattr(server, "server") else server.server.port
            os.write(write, str(port).encode())
            while True:
                time.sleep(3600)
        finally:
            os._exit(0)
    os.close(write)
    port = int(os.read(read, 32) or b"0")
    os.close(read)
    stack.append(_Child(pid))
    if not port:
        raise SystemExit("the server did not start in its child process")
    if hasattr(server, "server"):  # a stand-in on hypercorn: its address, the server itself not started here
        server.server = AsgiServer(server, tls=getattr(server, "tls", None))
        server.server.port = port
    else:
        server.port = port


def _provider_and_recipients(kind: str, n: int, stack: list, processes: bool = False) -> tuple[object, list[str]]:
    from benchmarks.push_standins import ApnsStandIn, FcmStandIn, WebPushStandIn
    from providers.kinds import build_provider

    if kind == "webhook":
        from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

        receiver = HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=600, record=False, verify_every=1000)
        _start(receiver, stack, processes)
        provider = build_provider("webhook", {"url": receiver.url}, {"signing_secret": TEST_SIGNING_SECRET})
        return provider, [f"tok_{i:08d}" for i in range(n)]
    if kind == "webhook-hypercorn":  # the webhook kind to the server the stand-ins run on
        from benchmarks.push_standins import HookStandIn
        from tests.support.receivers import TEST_SIGNING_SECRET

        hook = HookStandIn()
        _start(hook, stack, processes)
        provider = build_provider("webhook", {"url": hook.url}, {"signing_secret": TEST_SIGNING_SECRET})
        return provider, [f"tok_{i:08d}" for i in range(n)]
    # (hypercorn's GOAWAY after 1,000 requests of a connection drops the streams in flight: not APNs' habit)
    kinds = {"fcm": FcmStandIn, "webpush": WebPushStandIn}
    standin = ApnsStandIn(max_requests=10**9) if kind == "apns" else kinds[kind]()
    _start(standin, stack, processes and kind != "webpush")  # webpush subscribes in this process
    config, secrets = standin.provider_config()
    provider = build_provider(kind, config, secrets)
    if kind == "webpush":
        subscriptions = [json.dumps(standin.subscribe(f"u{i}").as_json()) for i in range(min(n, 200))]
        return provider, [subscriptions[i % len(subscriptions)] for i in range(n)]
    return provider, [f"{i:064x}" if kind == "apns" else f"fcm-{i:08d}" for i in range(n)]


async def _round(provider: object, recipients: list[str], concurrency: int, devices: int = 1) -> tuple[float, int]:
    from providers.kinds import OutboundMessage

    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(concurrency)
    done = loop.create_future()
    left = len(recipients)
    failed = 0
    first: list = []
    now = datetime.now(UTC)

    def finished(result: object) -> None:
        nonlocal left, failed
        if not result.delivered:
            failed += 1
            first.append(result)
        slots.release()
        left -= 1
        if left == 0 and not done.done():
            done.set_result(None)

    async def awaited(message: OutboundMessage) -> None:
        finished(await provider.send(message))

    started = time.thread_time()
    for i, recipient in enumerate(recipients):
        await slots.acquire()
        if i % devices == 0:  # a notification's devices share its subject, body and push (the fan-out)
            notification = (str(uuid.uuid4()), "Bench notification", "x" * 120, {"data": {"order": "42"}, "badge": 1})
        message = OutboundMessage(
            notification_id=notification[0], tenant_id="t", channel="push", recipient=recipient,
            subject=notification[1], body=notification[2], metadata={"bench": True}, created_at=now,
            push=notification[3],
        )  # fmt: skip
        if provider.start_send(message, finished) is None:
            loop.create_task(awaited(message))
    await done
    if first:
        print("first failure:", first[0], file=sys.stderr)
    return (time.thread_time() - started) / len(recipients) * 1e6, failed


async def _kind(kind: str, n: int, concurrency: int, repeat: int, devices: int = 1, processes: bool = False) -> dict:
    stack: list = []
    try:
        provider, recipients = _provider_and_recipients(kind, n, stack, processes)
        await _round(provider, recipients[: min(n, 500)], concurrency)  # connections, tokens, caches warm
        rounds = []
        for _ in range(repeat):
            cpu, failed = await _round(provider, recipients, concurrency, devices)
            if failed:
                raise SystemExit(f"{kind}: {failed} sends failed")
            rounds.append(cpu)
        await provider.aclose()
        return {"cpu_us_per_send": round(statistics.median(rounds), 1), "rounds": [round(r, 1) for r in rounds]}
    finally:
        for server in stack:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kinds", default="webhook,apns,fcm,webpush")
    parser.add_argument("--devices", type=int, default=1, help="devices per notification (its sends share its content)")
    parser.add_argument("--servers", choices=("threads", "processes"), default="threads",
                        help="run the stand-ins in threads of this process (sharing its GIL) or in child processes")
    args = parser.parse_args()
    import django

    django.setup()
    import uvloop

    from dispatch import gc_tuning

    results = {}
    for kind in args.kinds.split(","):
        gc_tuning.settle_after_start_up(args.concurrency, 1000)  # the collector as a dispatcher sets it
        processes = args.servers == "processes"
        results[kind] = uvloop.run(_kind(kind, args.n, args.concurrency, args.repeat, args.devices, processes))
        print(kind, json.dumps(results[kind]), flush=True)
    base = results.get("webhook", {}).get("cpu_us_per_send")
    if base:
        print(json.dumps({k: round(v["cpu_us_per_send"] / base, 2) for k, v in results.items()}))


if __name__ == "__main__":
    main()
