"""`make run`: migrate, make sure a demo tenant exists, then supervise web + scheduler + dispatcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand

from core.demo import ensure_demo


class Command(BaseCommand):
    help = "Run the API/admin server, one scheduler and one dispatcher until Ctrl-C."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--bind", default="127.0.0.1:8000")
        parser.add_argument("--grace-seconds", type=float, default=10.0)

    def handle(self, *args, bind: str, grace_seconds: float, **options) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        demo = ensure_demo()
        self.stdout.write(demo.banner(bind))

        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS": "true"}
        manage = [sys.executable, "manage.py"]
        programs = {"web": [*manage, "runserver", bind, "--noreload", "--skip-checks"]}
        available = get_commands()
        if "run_scheduler" in available:
            programs["scheduler"] = [*manage, "run_scheduler"]
        if "run_dispatcher" in available:
            programs["dispatcher"] = [*manage, "run_dispatcher"]

        children = {name: subprocess.Popen(cmd, env=env) for name, cmd in programs.items()}  # noqa: S603
        stop = threading.Event()
        received: list[int] = []

        def on_signal(signum: int, frame: object) -> None:
            received.append(signum)
            stop.set()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not stop.wait(0.5):
            dead = [name for name, proc in children.items() if proc.poll() is not None]
            if dead:
                self.stderr.write(f"{', '.join(dead)} exited; stopping the rest")
                break
        self.stdout.write(f"stopping ({signal.Signals(received[0]).name if received else 'child exit'}) …")
        for proc in children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for name, proc in children.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop within {grace_seconds:g}s; killing it")
                proc.kill()
                proc.wait()
        failed = {n: p.returncode for n, p in children.items() if p.returncode not in (0, -signal.SIGTERM)}
        if failed and not received:
            raise SystemExit(1)
        self.stdout.write("stopped")
