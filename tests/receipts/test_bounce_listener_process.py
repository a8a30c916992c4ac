"""`manage.py run_bounce_listener` as a real process: binds, answers over SMTP, stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import signal
import smtplib
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from providers import verp
from tests.queueing.dispatch_support import ROOT, wait_until
from tests.receipts.test_bounce_parsing import sample

DOMAIN = "bounces.omnipost.example"


def start_listener(env: dict, log: Path, *args: str) -> tuple[subprocess.Popen, int]:
    out = open(log, "w")  # noqa: SIM115 - the process writes to it until it exits
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "manage.py", "run_bounce_listener", "--bind", "127.0.0.1:0", *args],
        cwd=ROOT, env={**env, "OMNIPOST_BOUNCE_DOMAIN": DOMAIN}, stdout=out, stderr=out,
    )  # fmt: skip
    port: list[int] = []

    def bound() -> bool:
        found = re.search(r"bounce listener started on 127\.0\.0\.1:(\d+)", log.read_text())
        if found:
            port.append(int(found.group(1)))
        return bool(found) or proc.poll() is not None

    assert wait_until(bound, 30), log.read_text()
    assert port, log.read_text()
    return proc, port[0]


def mail(port: int, rcpts: list[str], raw: bytes) -> dict:
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as client:
        return client.sendmail("", rcpts, raw.replace(b"\n", b"\r\n"))


def test_listener_process_refuses_forgeries_and_non_reports_and_stops_on_sigterm(subprocess_env, tmp_path, settings):
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN  # this process makes the addresses; same SECRET_KEY as the listener's
    log = tmp_path / "listener.log"
    proc, port = start_listener(subprocess_env, log)
    try:
        good = verp.return_path(1, str(uuid.uuid4()))
        with pytest.raises(smtplib.SMTPRecipientsRefused):
            mail(port, [f"b+{'a' * 44}@{DOMAIN}"], sample("postfix_user_unknown.eml"))
        with pytest.raises(smtplib.SMTPDataError) as refused:
            mail(port, [good], sample("out_of_office.eml", good))
        assert refused.value.smtp_code == 554
        idle = smtplib.SMTP("127.0.0.1", port, timeout=10)  # an open session must not hold up the exit
        idle.ehlo()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "SIGTERM: stopping" in text and "bounce listener stopped" in text
    assert "Traceback" not in text
    assert good.split("@")[0][2:] not in text  # tokens (and any address) stay out of the log


def test_the_command_refuses_to_start_without_a_bounce_domain(subprocess_env):
    env = {k: v for k, v in subprocess_env.items() if k != "OMNIPOST_BOUNCE_DOMAIN"}
    done = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "run_bounce_listener", "--bind", "127.0.0.1:0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "OMNIPOST_BOUNCE_DOMAIN is not set" in done.stderr
    bad = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "run_bounce_listener", "--bind", "nonsense"],
        cwd=ROOT, env={**env, "OMNIPOST_BOUNCE_DOMAIN": DOMAIN}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode != 0 and "HOST:PORT" in bad.stderr
