"""The embedded PostgreSQL default (DATABASE_URL unset), with real processes and a real server, each
test in a throwaway var/: started on first need from an empty directory, migrated, a notification
delivered through a real dispatcher process; two processes starting at once share one server;
`stop()` ends it and the next start finds the same data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.embedded_db import DATABASE, EmbeddedPostgres
from tests.core.conftest import REPO
from tests.support.embedded import alive, embedded_env, postmasters, temporary_var

pytestmark = pytest.mark.slow

MANAGE = [sys.executable, str(REPO / "manage.py")]

# Runs inside `manage.py shell`: a console provider and a notification through the public API.
CREATE = """
import json
from django.test import Client
api = Client(HTTP_AUTHORIZATION="Bearer {key}")
made = api.post("/api/v1/providers", {{"name": "console-email", "channel": "email", "kind": "console",
                "is_default": True}}, content_type="application/json")
assert made.status_code == 201, made.content
sent = api.post("/api/v1/notifications", {{"channel": "email", "recipient": "jane@example.com", "subject": "Hi",
                "body": "Hello"}}, content_type="application/json")
assert sent.status_code == 201, sent.content
print(json.dumps(sent.json()))
"""
READ = """
import json
from django.test import Client
print(json.dumps(Client(HTTP_AUTHORIZATION="Bearer {key}").get("/api/v1/notifications/{id}").json()))
"""


def manage(var: Path, *args: str, timeout: float = 180) -> str:
    result = subprocess.run([*MANAGE, *args], cwd=var, env=embedded_env(var), capture_output=True, text=True,  # noqa: S603
                            timeout=timeout)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_a_clean_var_gets_a_server_that_delivers_through_a_real_dispatcher_and_keeps_its_data():
    with temporary_var() as var:
        server = EmbeddedPostgres(var)
        assert not server.data_dir.exists()

        manage(var, "migrate", "--verbosity", "0")  # the first need: initdb, start, create the database
        pid = server.pid()
        assert pid is not None and postmasters(server.data_dir) == [pid]
        assert (server.data_dir / "PG_VERSION").read_text().strip() == "18"
        tenant = json.loads(manage(var, "create_tenant", "acme", "--json"))
        created = json.loads(manage(var, "shell", "-c", CREATE.format(key=tenant["api_key"])).splitlines()[-1])
        assert created["status"] == "queued"

        # A real dispatcher process, on the server the earlier processes left running.
        manage(var, "run_dispatcher", "--once", "--no-jitter")
        read = READ.format(key=tenant["api_key"], id=created["id"])
        detail = json.loads(manage(var, "shell", "-c", read).splitlines()[-1])
        assert detail["status"] == "delivered"
        assert [a["outcome"] for a in detail["attempts"]] == ["delivered"]
        assert server.pid() == pid  # every command reused the one server

        assert server.stop() is True
        assert server.pid() is None and postmasters(server.data_dir) == []
        assert server.stop() is False  # nothing left to stop

        # The next process starts it again, on the same data.
        detail = json.loads(manage(var, "shell", "-c", read).splitlines()[-1])
        assert detail["status"] == "delivered" and detail["id"] == created["id"]
        assert server.pid() not in (None, pid)


# Both processes import Django, then wait for the same moment to read the settings (which start the server).
AT_ONCE = """
import os, sys, time
import django
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.001)
django.setup()
from django.conf import settings
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT current_database(), pg_postmaster_start_time()::text")
    print(settings.OMNIPOST_EMBEDDED_DATABASE.pid(), *cursor.fetchone())
"""


def test_two_processes_starting_at_once_start_one_server_and_share_it():
    with temporary_var() as var:
        go = var / "go"
        procs = [
            subprocess.Popen([sys.executable, "-c", AT_ONCE, str(go)], cwd=REPO, env=embedded_env(var),  # noqa: S603
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            for _ in range(2)
        ]
        time.sleep(1.0)  # both are past their imports and polling for the file
        go.touch()
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(out.split())
        server = EmbeddedPostgres(var)
        assert outputs[0] == outputs[1], outputs  # one postmaster, started once, serving both
        assert outputs[0][:2] == [str(server.pid()), DATABASE]
        assert postmasters(server.data_dir) == [server.pid()]


def kill_postmaster(server: EmbeddedPostgres) -> int:
    """SIGKILL, as a crash would; returns once the process has exited (it stays a zombie of init)."""
    pid = server.pid()
    os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid


def test_a_server_killed_without_a_clean_stop_is_started_again():
    """A postmaster.pid left behind (kill -9, a reboot) does not pass for a running server."""
    with temporary_var() as var:
        server = EmbeddedPostgres(var)
        server.start()
        pid = kill_postmaster(server)
        assert (server.data_dir / "postmaster.pid").exists() and server.pid() is None

        assert server.start()["HOST"] == str(server.socket_dir)
        assert server.pid() not in (None, pid)

        kill_postmaster(server)
        assert server.stop() is False  # nothing ran; the stale lock files go
        assert not (server.data_dir / "postmaster.pid").exists()
        assert not (server.socket_dir / ".s.PGSQL.5432.lock").exists()
