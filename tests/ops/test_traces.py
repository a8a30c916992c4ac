"""Traces over OTLP, through a real receiver (tests.support.otlp decodes what the SDK's exporter
posts with the official protobuf messages) and real processes: a notification created through the
web server (gunicorn), promoted by a scheduler process, sent by a dispatcher process to a loopback
webhook receiver, and its signed receipt posted back to the web server, make one trace whose id is
the notification's, with spans from each process linked parent to child; the webhook carried a
`traceparent` naming that trace and the send span. Without an endpoint: no SDK, no exporter
thread, no `traceparent`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from django.db import connection

from core import tracing
from core.models import ApiKey
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit
from tests.receipts.conftest import signed
from tests.support import web
from tests.support.fixtures import webhook_receiver  # noqa: F401
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.pgserver import free_port
from tests.support.receivers import TEST_SIGNING_SECRET

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
RECIPIENT = "cust_trace_7Qx"  # must appear in no span


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def _traced_env(env: dict[str, str], otlp: OtlpReceiver) -> dict[str, str]:
    clean = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    # A short batch delay: the web process's spans go out while it runs, not only at its exit.
    return {**clean, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def _run(env: dict[str, str], log: Path, *args: str) -> None:
    with log.open("w") as out:
        proc = subprocess.run(  # noqa: S603
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, stdout=out, stderr=out, timeout=90, check=False
        )
    assert proc.returncode == 0, log.read_text()[-3000:]


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [(s.name, s.span_id, s.parent_span_id) for s in spans])
    return found[0]


def test_one_trace_per_notification_across_processes(
    otlp, webhook_receiver, tenant_a, subprocess_env, tmp_path  # noqa: F811
):
    env = _traced_env(subprocess_env, otlp)
    hook = factories.provider(tenant_a, "hook", config={"url": webhook_receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, is_default=True)  # fmt: skip
    with web.gunicorn(env) as served:
        api = httpx.Client(base_url=f"{served.url}/api/v1",
                           headers={"Authorization": f"Bearer {ApiKey.issue(tenant_a)[1]}"}, timeout=10)  # fmt: skip
        later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        created = api.post("/notifications", json={"channel": "webhook", "recipient": RECIPIENT, "body": "secret body",
                                                   "scheduled_for": later})  # fmt: skip
        assert created.status_code == 201, created.text
        note_id = uuid.UUID(created.json()["id"])
        assert created.json()["status"] == "scheduled"
        trace_id = f"{note_id.int:032x}"

        # Due now: a scheduler process promotes it, a dispatcher process sends it.
        with connection.cursor() as cursor:
            cursor.execute("UPDATE scheduled_jobs SET run_at = now() WHERE notification_id = %s", [note_id])
            assert cursor.rowcount == 1
        _run(env, tmp_path / "scheduler.log", "run_scheduler", "--once", "--no-jitter")
        [dispatcher] = start_dispatchers(1, env, "--once", "--no-listen", "--no-events", log_dir=tmp_path)
        assert wait_exit([dispatcher], 90) == [0], (tmp_path / "dispatcher0.log").read_text()[-3000:]
        assert webhook_receiver.wait_for(1)
        [sent] = webhook_receiver.requests
        assert sent.verified and sent.headers["webhook-id"] == str(note_id)

        # The receiver's signed receipt, to the provider's URL on the web server.
        receipt = {"type": "delivered", "notification_id": str(note_id), "occurred_at": datetime.now(UTC).isoformat()}
        body, headers = signed(TEST_SIGNING_SECRET, receipt, msg_id="evt_trace_1")
        answer = httpx.post(f"{served.url}/hooks/providers/{hook.pk}", content=body,
                            headers={**headers, "Content-Type": "application/json"}, timeout=10)  # fmt: skip
        assert answer.status_code == 200 and answer.json() == {"received": 1}
        names = ["notification.create", "notification.claim", "notification.send", "notification.receipt"]
        spans = otlp.wait_for(names, trace_id, timeout=20)
        web_pid = served.process.pid

    create, claim, send, got = (_one(spans, name) for name in names)
    # One trace, the notification's: its root has the ids derived from the notification's UUID.
    assert {s.trace_id for s in spans} == {trace_id}
    assert create.span_id == f"{tracing.root_span_id_of(note_id):016x}" and create.parent_span_id == ""
    assert claim.parent_span_id == create.span_id
    assert send.parent_span_id == claim.span_id
    assert got.parent_span_id == create.span_id
    # From the processes that did each part, all under the default service name.
    assert {s.service for s in spans} == {"omnipost"}
    assert create.resource["omnipost.process"] == got.resource["omnipost.process"] == "web"
    assert create.resource["process.pid"] != web_pid  # a gunicorn worker's, not its arbiter's
    assert claim.resource["omnipost.process"] == send.resource["omnipost.process"] == "dispatcher"
    assert claim.resource["process.pid"] == send.resource["process.pid"] == dispatcher.pid
    # In order, and saying what happened.
    assert create.end_ns <= claim.start_ns <= claim.end_ns <= send.start_ns <= send.end_ns <= got.start_ns
    assert create.attributes == {"omnipost.channel": "webhook", "omnipost.status": "scheduled",
                                 "omnipost.provider_kind": "webhook"}  # fmt: skip
    assert send.attributes == {"omnipost.provider_kind": "webhook", "omnipost.channel": "webhook",
                               "omnipost.attempt": 1, "omnipost.outcome": "delivered",
                               "http.response.status_code": 200}  # fmt: skip
    assert send.status_code == 0  # not an error
    assert got.attributes == {"omnipost.provider_kind": "webhook", "omnipost.receipt_type": "delivered",
                              "omnipost.receipt": "delivered", "omnipost.receipt_changed": True}  # fmt: skip
    # The webhook named the trace and the send span.
    assert sent.headers["traceparent"] == f"00-{trace_id}-{send.span_id}-01"
    # The scheduler's own span: its batch, in a trace of its own.
    [promote] = [s for s in otlp.spans if s.name == "scheduler.promote"]
    assert promote.resource["omnipost.process"] == "scheduler" and promote.service == "omnipost"
    assert promote.attributes["omnipost.promoted"] == 1 and promote.trace_id != trace_id
    # Never the recipient, the body or the signing secret.
    everything = json.dumps([[s.attributes, s.resource] for s in otlp.spans])
    assert RECIPIENT not in everything and "secret body" not in everything and TEST_SIGNING_SECRET not in everything


def test_a_failed_send_is_an_error_span_and_the_service_name_is_configurable(
    otlp, webhook_receiver, tenant_a, subprocess_env, tmp_path  # noqa: F811
):
    """A 503 from the receiver: the send span says so, and `OTEL_SERVICE_NAME` names the service."""
    env = {**_traced_env(subprocess_env, otlp), "OTEL_SERVICE_NAME": "omnipost-eu"}
    webhook_receiver.configure(status=503, retry_after="60")  # one try in this run
    hook = factories.provider(tenant_a, "hook", config={"url": webhook_receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, is_default=True)  # fmt: skip
    [note] = factories.queued(tenant_a, hook, 1)
    [dispatcher] = start_dispatchers(1, env, "--once", "--no-listen", "--no-events", log_dir=tmp_path)
    assert wait_exit([dispatcher], 90) == [0], (tmp_path / "dispatcher0.log").read_text()[-3000:]
    trace_id = f"{note.pk.int:032x}"
    spans = otlp.wait_for(["notification.claim", "notification.send"], trace_id, timeout=10)
    send = _one(spans, "notification.send")
    assert send.service == "omnipost-eu"
    assert send.attributes["omnipost.outcome"] == "retry"
    assert send.attributes["http.response.status_code"] == 503
    assert send.attributes["omnipost.error_code"] == "http_503"
    assert send.status_code == 2  # error
    # Its parent's parent is the root no process stored: rebuilt from the notification's id.
    assert _one(spans, "notification.claim").parent_span_id == f"{tracing.root_span_id_of(note.pk):016x}"
    assert webhook_receiver.requests[0].headers["traceparent"] == f"00-{trace_id}-{send.span_id}-01"


def test_each_process_exports_what_it_holds_when_it_stops(
    otlp, webhook_receiver, tenant_a, subprocess_env, tmp_path  # noqa: F811
):
    """The web server as `make run` runs it (granian's ASGI interface, whose workers end past atexit;
    the create answered in its thread bridge) and a dispatcher, each exporting only when it stops (a
    batch delay of a minute): the spans arrive."""
    env = {**_traced_env(subprocess_env, otlp), "OTEL_BSP_SCHEDULE_DELAY": "60000"}
    hook = factories.provider(tenant_a, "hook", config={"url": webhook_receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, is_default=True)  # fmt: skip
    port = free_port()
    server = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "granian", "--interface", "asgi", "--workers", "1", "--host", "127.0.0.1",
         "--port", str(port), "--no-ws", "--log-level", "warning", "omnipost_site.asgi:application"],
        cwd=ROOT, env={**env, "OMNIPOST_WEB_THREADS": "2"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "granian did not come up"
            time.sleep(0.2)
        api = httpx.Client(base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {ApiKey.issue(tenant_a)[1]}"},
                           timeout=10)  # fmt: skip
        created = api.post("/notifications", json={"channel": "webhook", "recipient": RECIPIENT, "body": "hi"})
        assert created.status_code == 201, created.text
        trace_id = uuid.UUID(created.json()["id"]).hex
        assert otlp.wait_for(["notification.create"], trace_id, timeout=0.5) == []  # held for its batch
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    spans = otlp.wait_for(["notification.create"], trace_id, timeout=10)
    assert [(s.name, s.resource["omnipost.process"]) for s in spans] == [("notification.create", "web")], \
        "the web worker's spans were not exported when it stopped"
    [dispatcher] = start_dispatchers(1, env, "--once", "--no-listen", "--no-events", log_dir=tmp_path)
    assert wait_exit([dispatcher], 90) == [0], (tmp_path / "dispatcher0.log").read_text()[-3000:]
    spans = otlp.wait_for(["notification.claim", "notification.send"], trace_id, timeout=10)
    assert sorted(s.name for s in spans) == ["notification.claim", "notification.create", "notification.send"]
    assert hook.pk and webhook_receiver.requests[0].headers["traceparent"].startswith(f"00-{trace_id}-")


def test_unset_no_sdk_no_exporter_thread_no_traceparent(webhook_receiver, tenant_a, subprocess_env, tmp_path):  # noqa: F811
    env = {k: v for k, v in subprocess_env.items() if not k.startswith("OTEL_")}
    hook = factories.provider(tenant_a, "hook", config={"url": webhook_receiver.url},
                              secrets={"signing_secret": TEST_SIGNING_SECRET}, is_default=True)  # fmt: skip
    factories.queued(tenant_a, hook, 1)
    [dispatcher] = start_dispatchers(1, env, "--once", "--no-listen", "--no-events", log_dir=tmp_path)
    assert wait_exit([dispatcher], 90) == [0], (tmp_path / "dispatcher0.log").read_text()[-3000:]
    assert webhook_receiver.wait_for(1)
    assert "traceparent" not in webhook_receiver.requests[0].headers

    # A web process's start-up (the WSGI module), then what it holds: nothing of OpenTelemetry when
    # unset; the SDK and its exporter thread when set (so the check can see them).
    probe = (
        "import sys, threading\n"
        "import omnipost_site.wsgi\n"
        "from core import tracing\n"
        "print(tracing.ENABLED, sorted(m for m in sys.modules if m.startswith('opentelemetry')) != [],\n"
        "      sorted(t.name for t in threading.enumerate() if t.name.startswith('OtelBatch')))\n"
    )
    unset = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,  # noqa: S603
                           timeout=60, check=True)  # fmt: skip
    assert unset.stdout.split("\n")[-2] == "False False []"
    with OtlpReceiver() as otlp:
        traced = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint}
        on = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=traced, capture_output=True, text=True,  # noqa: S603
                            timeout=60, check=True)  # fmt: skip
    assert on.stdout.split("\n")[-2] == "True True ['OtelBatchSpanRecordProcessor']"
    assert not tracing.ENABLED and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") is None
