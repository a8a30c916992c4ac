"""A benchmark's dispatcher: the ordinary one behind a start gate, with its figures read from outside.

    python -m benchmarks.dispatcher [--go-file GO] [--stats-file STATS] [run_dispatcher options…]

Started by the runner with every other dispatcher of a run, it gets ready (Django loaded,
connected, registered, garbage collector settled), writes `GO.ready.<host>.<pid>` and claims nothing until
`GO` exists, so no process's start-up runs while another delivers; it stops waiting if the process
that started it exits. At the end it writes STATS as JSON: delivered and claimed (the dispatcher's
own counters), SQL statements sent by this process (counted at psycopg's cursor, every thread,
the LISTEN connection's included) and garbage collections after start-up. None of this touches
the dispatcher's code: it runs through the `Observer` the Dispatcher accepts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys


class Statements:
    """Counts every statement this process sends through psycopg (Django's cursors and the hot
    path's raw ones are all psycopg cursors)."""

    def __init__(self) -> None:
        import psycopg

        self.count = 0
        original = psycopg.Cursor.execute

        def counted(cursor, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            self.count += 1
            return original(cursor, *args, **kwargs)

        psycopg.Cursor.execute = counted


class Timeline:
    """`--timeline`: wall-clock stamps (time.time(), comparable across this host's processes) of each
    step from a ring to a send, for `omnipost_bench --pickup`'s breakdown: the doorbell thread's
    ring, the event loop's wake-up, the claim on the DB thread or on the doorbell thread (its
    statement inside it), each send started (by notification id). Patched in from outside, as
    `Statements` is: the dispatcher's code is not touched."""

    def __init__(self) -> None:
        import time

        from dispatch import claims, dispatcher, sending

        self.rings: list[float] = []
        self.rungs: list[float] = []
        self.claims: list[dict] = []  # start, statement start/end, end, back (on the loop), keys
        self.sends: dict[str, float] = {}
        now = time.time
        timeline = self

        ring, rung = dispatcher.Dispatcher._ring, dispatcher.Dispatcher._rung

        def timed_ring(self, payload):  # noqa: ANN001, ANN202
            timeline.rings.append(now())
            return ring(self, payload)

        def timed_rung(self):  # noqa: ANN001, ANN202
            timeline.rungs.append(now())
            return rung(self)

        answer = dispatcher.Dispatcher._answer_ring

        def timed_answer(self, conn, payload):  # noqa: ANN001, ANN202
            timeline.rings.append(now())
            return answer(self, conn, payload)

        dispatcher.Dispatcher._ring, dispatcher.Dispatcher._rung = timed_ring, timed_rung
        dispatcher.Dispatcher._answer_ring = timed_answer

        claim, statement = claims.Claimer.claim, claims.claim_and_start
        current: list[dict] = []

        def timed_claim(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            entry = {"start": now()}
            current[:] = [entry]
            result = claim(self, *args, **kwargs)
            entry["end"] = now()
            entry["keys"] = [p.notification_key for p in result.send]
            if entry["keys"]:
                timeline.claims.append(entry)
            return result

        def timed_statement(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            started = now()
            try:
                return statement(*args, **kwargs)
            finally:
                if current:
                    current[0]["statement"] = (started, now())

        claim_rung = claims.Claimer.claim_rung

        def timed_claim_rung(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            entry = {"start": now(), "path": "doorbell"}
            current[:] = [entry]
            result = claim_rung(self, *args, **kwargs)
            entry["end"] = now()
            entry["keys"] = [p.notification_key for p in result[0]] if result else []
            if entry["keys"]:
                timeline.claims.append(entry)
            return result

        claims.Claimer.claim, claims.claim_and_start = timed_claim, timed_statement
        claims.Claimer.claim_rung = timed_claim_rung

        start = sending.Sender.start

        def timed_start(self, item):  # noqa: ANN001, ANN202
            timeline.sends[item.notification_key] = now()
            return start(self, item)

        sending.Sender.start = timed_start

    def figures(self) -> dict:
        return {"rings": self.rings, "rungs": self.rungs, "claims": self.claims, "sends": self.sends}


class GoGate:
    """The Observer: waits for the go before the first claim; writes the figures at the end."""

    def __init__(
        self, go_file: str | None, stats_file: str | None, statements: Statements, timeline: Timeline | None = None
    ) -> None:
        self.timeline = timeline
        self.go_file = go_file
        self.stats_file = stats_file
        self.statements = statements
        self.collections_at_start = 0
        self.statements_at_start = 0

    async def started(self, dispatcher) -> None:  # noqa: ANN001
        from dispatch import gc_tuning

        if self.go_file is None:
            self.collections_at_start = gc_tuning.collections_so_far()
            return
        parent = os.getppid()
        with open(f"{self.go_file}.ready.{socket.gethostname()}.{os.getpid()}", "w"):  # a pid is one host's
            pass
        while not os.path.exists(self.go_file) and not dispatcher.stopping.is_set():
            if os.getppid() != parent:  # whoever was to say go has gone: do not wait forever
                print("the process that started this dispatcher exited before the go; stopping", file=sys.stderr)
                dispatcher.stopping.set()
                return
            await asyncio.sleep(0.001)
        self.collections_at_start = gc_tuning.collections_so_far()
        self.statements_at_start = self.statements.count

    def stopped(self, dispatcher) -> None:  # noqa: ANN001
        from dispatch import gc_tuning

        if not self.stats_file:
            return
        figures = {
            "delivered": dispatcher.processed,
            "claimed": dispatcher.claimed,
            "statements": self.statements.count - self.statements_at_start,
            "gc_collections": gc_tuning.collections_so_far() - self.collections_at_start,
        }
        if self.timeline is not None:
            figures["timeline"] = self.timeline.figures()
        with open(self.stats_file, "w") as fh:
            json.dump(figures, fh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--go-file", help="wait for this file before claiming (none: start at once)")
    parser.add_argument("--stats-file")
    parser.add_argument("--timeline", action="store_true", help="stamp each step from a ring to a send (STATS)")
    ours, rest = parser.parse_known_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")
    import django

    django.setup()
    from core.process_name import set_process_name
    from dispatch.dispatcher import Dispatcher
    from dispatch.management.commands.run_dispatcher import Command, config_from

    options = vars(Command().create_parser("manage.py", "run_dispatcher").parse_args(rest))
    statements = Statements()
    set_process_name("omnipost-disp")
    gate = GoGate(ours.go_file, ours.stats_file, statements, Timeline() if ours.timeline else None)
    return Dispatcher(config_from(options), observer=gate).run()


if __name__ == "__main__":
    sys.exit(main())
