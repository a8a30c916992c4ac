"""bench/versus.py's pieces that bench/per_delivery.py measures through: the phase gate it speaks
with `omnipost_bench --phase-gate`, and the CPU a worker spent in its life, read at its exit; and its one
readable line for a database it cannot use."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import time

from tests.queueing.dispatch_support import ROOT

_spec = importlib.util.spec_from_file_location("versus", ROOT / "bench" / "versus.py")
versus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(versus)

GATED = textwrap.dedent(
    """
    import json, sys
    print("some table line", flush=True)
    for phase in ("delivering", "drained"):
        print(json.dumps({"phase": phase, "pids": [41, 42]}), flush=True)
        if sys.stdin.readline() != "go\\n":
            sys.exit(3)
    sys.exit(0 if sys.stdin.read() == "" else 4)  # closed after the last answer
    """
)


def test_the_gate_is_called_at_each_phase_and_each_is_answered():
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", GATED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    seen = []
    versus.follow_phase_gate(proc, lambda phase, pids: seen.append((phase, pids)), time.time() + 30)
    assert proc.wait(timeout=30) == 0
    assert seen == [("delivering", [41, 42]), ("drained", [41, 42])]


def test_a_silent_process_runs_into_the_deadline():
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", "import time; time.sleep(30)"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        began = time.monotonic()
        try:
            versus.follow_phase_gate(proc, lambda *_: None, time.time() + 0.5)
        except subprocess.TimeoutExpired:
            assert time.monotonic() - began < 5
        else:
            raise AssertionError("no timeout")
    finally:
        proc.kill()
        proc.wait()


def test_reap_returns_the_cpu_of_the_worker_s_whole_life_and_its_exit_status():
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nraise SystemExit(5)"
    proc = subprocess.Popen([sys.executable, "-c", burn])  # noqa: S603
    seconds = versus.reap(proc, time.time() + 60)
    assert seconds >= 0.3
    assert proc.returncode == 5 and proc.poll() == 5


def test_a_missing_or_unmigrated_database_exits_1_with_one_readable_line(tmp_path):
    import os

    import psycopg
    from django.db import connection

    base = connection.settings_dict
    url = f"postgres://{base['USER']}:{base['PASSWORD'] or ''}@{base['HOST']}:{base['PORT']}"
    empty = f"omnipost_versus_empty_{os.getpid()}"
    with psycopg.connect(f"{url}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{empty}"')
        admin.execute(f'CREATE DATABASE "{empty}"')
    try:
        for name, says in ((f"omnipost_versus_absent_{os.getpid()}", "does not exist"), (empty, "manage.py migrate")):
            done = subprocess.run(  # noqa: S603
                [sys.executable, str(ROOT / "bench" / "versus.py"), "--only", "omnipost", "-n", "10"],
                env={**os.environ, "DATABASE_URL": f"{url}/{name}"}, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 1, done.stderr
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("versus: FAILED: ") and says in lines[0], done.stderr
    finally:
        with psycopg.connect(f"{url}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{empty}"')
