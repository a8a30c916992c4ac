"""One `omnipost_bench --queue-only` process: claim and ack no-op items as fast as it can.

    python -m benchmarks.claimer --count N --batch B --out FILE

Writes {"acked": n, "first": t, "last": t} (unix seconds of the first claim and the last ack).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--priority", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")
    import django

    django.setup()
    from queueing import queue

    acked = 0
    first = last = time.time()
    empty_since = None
    while acked < args.count:
        leases = queue.claim(min(args.batch, args.count - acked), queues=["bench"])
        if not leases:
            # Like a real worker, look again for a moment before calling the queue drained.
            empty_since = empty_since or time.monotonic()
            if time.monotonic() - empty_since > 2.0:
                break
            time.sleep(0.01)
            continue
        empty_since = None
        if acked == 0:
            first = time.time()
        acked += len(queue.ack(leases))
        last = time.time()
    with open(args.out, "w") as fh:
        json.dump({"acked": acked, "first": first, "last": last}, fh)


if __name__ == "__main__":
    main()
