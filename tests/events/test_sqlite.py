"""Event webhooks on SQLite (the zero-setup default `make run` uses), in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.queueing.dispatch_support import ROOT
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

EVENT_SECRET = "whsec_" + "c3FsaXRlLWV2ZW50cy1zZWNyZXQtMzItYnl0ZXMhIQ=="


def test_events_are_emitted_delivered_disabled_and_recovered_on_sqlite(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "omnipost_site.settings_test",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'events.sqlite3'}", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)  # noqa: S603
    with HttpReceiver(secret=TEST_SIGNING_SECRET) as hook, HttpReceiver(secret=EVENT_SECRET) as events_rx:
        out = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "tests.events.sqlite_flow", "--hook", hook.url, "--events", events_rx.url,
             "--secret", EVENT_SECRET, "--hook-secret", TEST_SIGNING_SECRET],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        extra = result.pop("extra")
        assert result == {"exit": [0, 0], "delivered_first": 3, "claimed": 1, "disabled": True, "recovered": 1,
                          "delivered_after": 4}  # fmt: skip
        ok = [r for r in events_rx.requests if r.status == 200]
        assert len(ok) == 4 and all(r.verified for r in events_rx.requests)
        assert len({r.webhook_id for r in ok}) == 4 and ok[-1].webhook_id == extra  # recovered with its own id
        assert {r.payload["type"] for r in ok} == {"notification.delivered"}
