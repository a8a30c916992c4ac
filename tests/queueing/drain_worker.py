"""A real worker process for the queue tests: claims, "processes" (writes the id), acks.

    python -m tests.queueing.drain_worker --out FILE [--batch N] [--lease S] [--idle-exit S]
    python -m tests.queueing.drain_worker --processes N --out DIR/w{n}.log   # N workers forked after start-up
    python -m tests.queueing.drain_worker --hold --out FILE # claim once, report leases, never ack

Lines written: `P <notification_id> <unix time>` per processed item, `L <item_id> <lock_token>` per held lease,
`A <count>` per ack with the number acked, `X <count>` for leases lost to a peer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--idle-exit", type=float, default=1.5)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--processes", type=int, default=1,
                        help="fork this many workers once Django is set up (no session is open yet); "
                             "{n} in --out is each one's index")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings_test")
    import django

    django.setup()

    if args.processes > 1:
        return _fork(args)
    return _work(args, args.out.replace("{n}", "0"))


def _fork(args: argparse.Namespace) -> int:
    """N real processes for the price of one start-up: each child has its own sessions and exits
    with its own code; the parent's is non-zero when any child's is."""
    children = []
    for n in range(args.processes):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _work(args, args.out.replace("{n}", str(n)))
            finally:
                os._exit(code)
        children.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    return 0 if codes == [0] * len(codes) else 1


def _work(args: argparse.Namespace, path: str) -> int:
    from django.db import transaction

    from queueing import queue

    out = open(path, "a", buffering=1)  # noqa: SIM115 - line-buffered for the parent to read
    if args.hold:
        leases = queue.claim(args.batch, lease_seconds=args.lease)
        for lease in leases:
            out.write(f"L {lease.item_id} {lease.lock_token}\n")
        out.write("READY\n")
        time.sleep(args.max_seconds)
        return 0

    deadline = time.monotonic() + args.max_seconds
    idle_since = time.monotonic()
    while time.monotonic() < deadline:
        with transaction.atomic():
            leases = queue.claim(args.batch, lease_seconds=args.lease)
        if not leases:
            if time.monotonic() - idle_since > args.idle_exit:
                break
            time.sleep(0.02)
            continue
        idle_since = time.monotonic()
        now = time.time()
        out.write("".join(f"P {lease.notification_id} {now:.3f}\n" for lease in leases))
        with transaction.atomic():
            acked = queue.ack(leases)
        out.write(f"A {len(acked)}\n")
        if len(acked) != len(leases):
            out.write(f"X {len(leases) - len(acked)}\n")
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
