"""`make run`: migrate, make sure a demo tenant exists, then supervise web + scheduler + dispatcher;
on the way out, stop the embedded PostgreSQL server they shared (when DATABASE_URL is unset)."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand
from django.db import connections

from omnipost_site.ops.demo import ensure_demo


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, children get SIGTERM if the supervisor itself is killed, so none are orphaned."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)

    return preexec


WEB_WORKERS = 2
WEB_THREADS = 4  # the API's threads a worker (OMNIPOST_WEB_THREADS's default under granian)
# Requests a granian worker takes at once: every open live inbox stream is one, and past this many new
# connections wait in the backlog unanswered (granian's default is backlog / workers: 512 here).
WEB_STREAMS = 4096


def web_server(bind: str, manage: list[str]) -> list[str]:
    """One granian ASGI process on omnipost_site.asgi: the live inbox stream on its event loop and the
    API in OMNIPOST_WEB_THREADS threads a worker, on one port, as the Procfile's `web` and `stream`
    processes behind a proxy's path route are (docs/DECISIONS.md, "Serving": the API is faster under
    the WSGI interface, which production runs); its stop bounded like gunicorn's graceful timeout (open
    streams end then). Else gunicorn gthread (no stream), else runserver."""
    host, _, port = bind.rpartition(":")
    if importlib.util.find_spec("granian") is not None:
        return [sys.executable, "-m", "granian", "--interface", "asgi", "--workers", str(WEB_WORKERS),
                "--backpressure", str(WEB_STREAMS), "--host", host or "127.0.0.1", "--port", port, "--no-ws",
                "--respawn-failed-workers", "--workers-kill-timeout", "5", "--log-level", "warning",
                "omnipost_site.asgi:application"]  # fmt: skip
    if importlib.util.find_spec("gunicorn") is not None:
        return [sys.executable, "-m", "gunicorn", "omnipost_site.wsgi:application", "--bind", bind, "--workers",
                str(WEB_WORKERS), "--worker-class", "gthread", "--threads", str(WEB_THREADS), "--graceful-timeout",
                "5", "--log-level", "warning"]  # fmt: skip
    return [*manage, "runserver", bind, "--noreload", "--skip-checks"]


class Command(BaseCommand):
    help = "Run the API/admin server, one scheduler and one dispatcher until Ctrl-C."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--bind", default="127.0.0.1:8000")
        # Ctrl-C stops everything within 10 s: the children's grace, then the embedded server's fast shutdown.
        parser.add_argument("--grace-seconds", type=float, default=7.0)

    _stopping_since: float | None = None  # when the first Ctrl-C (or SIGTERM) came

    def handle(self, *args, bind: str, grace_seconds: float, **options) -> None:
        try:
            self._serve(bind, grace_seconds)
        finally:  # also after a failed migrate or a Ctrl-C before the children started
            self._stop_embedded_database()

    def _serve(self, bind: str, grace_seconds: float) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        demo = ensure_demo()
        self.stdout.write(demo.banner(bind))
        self.stdout.flush()  # a pipe (`make run | tee`) would otherwise hold the banner back

        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS": "true"}
        # The base of events_url (and every URL handed out): this server unless the caller set one.
        env.setdefault("OMNIPOST_PUBLIC_URL", f"http://{bind}")
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        # granian (or gunicorn) and the workers stop gracefully on SIGTERM (in-flight requests and sends finish);
        # runserver exits 0 on SIGINT (and dies on SIGTERM).
        web = web_server(bind, manage)
        programs: dict[str, tuple[list[str], signal.Signals]] = {
            "web": (web, signal.SIGINT if "runserver" in web else signal.SIGTERM)
        }
        available = get_commands()
        if "run_scheduler" in available:
            programs["scheduler"] = ([*manage, "run_scheduler"], signal.SIGTERM)
        if "run_dispatcher" in available:
            programs["dispatcher"] = ([*manage, "run_dispatcher"], signal.SIGTERM)

        stop = threading.Event()
        received: list[int] = []

        def on_signal(signum: int, frame: object) -> None:
            received.append(signum)
            if self._stopping_since is None:
                self._stopping_since = time.monotonic()
            stop.set()

        # Handlers go in before any child starts, so an early Ctrl-C cannot orphan one.
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

        children: dict[str, subprocess.Popen] = {}
        crashed: list[str] = []
        try:
            for name, (cmd, _) in programs.items():
                # Own process group: Ctrl-C in the terminal reaches only this supervisor, which then
                # stops each child once; a second signal to a worker would mean "force exit".
                children[name] = subprocess.Popen(  # noqa: S603
                    cmd, env=env, cwd=settings.BASE_DIR, process_group=0, preexec_fn=_die_with_parent()
                )
            while not stop.wait(0.2):
                crashed = [name for name, proc in children.items() if proc.poll() is not None]
                if crashed:
                    self.stderr.write(f"{', '.join(crashed)} exited; stopping the rest")
                    break
        finally:
            reason = signal.Signals(received[0]).name if received else "child exit"
            self.stdout.write(f"stopping ({reason}) …")
            self._stop_children(children, programs, grace_seconds, received)

        unexpected = {
            name: proc.returncode
            for name, proc in children.items()
            if name in crashed or proc.returncode not in (0, -signal.SIGTERM, -signal.SIGINT)
        }
        if unexpected:
            self.stderr.write(f"exited abnormally: {unexpected}")
            raise SystemExit(1)
        # Each child's exit code, so a clean stop of all three is visible (and testable).
        self.stdout.write(f"stopped ({', '.join(f'{name} {proc.returncode}' for name, proc in children.items())})")

    def _stop_embedded_database(self) -> None:
        embedded = settings.OMNIPOST_EMBEDDED_DATABASE
        if embedded is None:
            return
        connections.close_all()
        # The server's fast shutdown gets what the children left of the 10 s (at least a second).
        remaining = 9.5 - (time.monotonic() - self._stopping_since) if self._stopping_since else 2.0
        if embedded.stop(timeout=max(1.0, remaining)):
            self.stdout.write(f"stopped the embedded PostgreSQL server ({embedded.data_dir})")

    def _stop_children(
        self,
        children: dict[str, subprocess.Popen],
        programs: dict[str, tuple[list[str], signal.Signals]],
        grace_seconds: float,
        received: list[int],
    ) -> None:
        for name, proc in children.items():
            if proc.poll() is None:
                proc.send_signal(programs[name][1])
        deadline = time.monotonic() + grace_seconds
        signals_seen = len(received)
        while any(proc.poll() is None for proc in children.values()):
            if time.monotonic() >= deadline or len(received) > signals_seen:
                why = "a second signal" if len(received) > signals_seen else f"{grace_seconds:g}s"
                for name, proc in children.items():
                    if proc.poll() is None:
                        self.stderr.write(f"{name} still running after {why}; killing it")
                        proc.kill()
                break
            time.sleep(0.05)
        for proc in children.values():
            proc.wait()
