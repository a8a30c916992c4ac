"""`manage.py dlq_redrive`: filters, dry run, pacing, batches of fixed cost over 20,000 entries, readable
errors, two processes at once, and Ctrl-C."""

from __future__ import annotations

import functools
import io
import signal
import subprocess
import sys
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.models import AuditEvent
from dlq import services
from dlq.models import DeadLetter
from queueing.models import QueueItem
from tests import factories
from tests.dlq.test_services import FakeClock, bulk_dead_letters_sql, dead_letters
from tests.queueing.dispatch_support import ROOT, wait_until


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("dlq_redrive", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def manage(env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "dlq_redrive", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


@pytest.mark.django_db
def test_filters_dry_run_and_summary(tenant_a, tenant_b):
    hook_a, hook_b = factories.provider(tenant_a, "hook-a"), factories.provider(tenant_b, "hook-b")
    dead_letters(tenant_a, hook_a, 3)
    dead_letters(tenant_a, hook_a, 2, status="failed", failure_class="permanent")
    dead_letters(tenant_b, hook_b, 4)
    out, _ = run("--tenant", "tenant-a", "--dry-run")
    assert out.strip() == "dry run: 5 entries would be redriven"
    assert not QueueItem.objects.exists()
    out, err = run("--tenant", str(tenant_a.pk), "--failure-class", "permanent")
    assert out.startswith("redriven 2 of 2 matching entries in ") and out.strip().endswith("refused: none")
    assert "2/2" in err  # the progress bar, on stderr
    out, _ = run("--since", "2000-01-01T00:00:00+00:00", "--limit", "4", "--provider", "hook-b")
    assert out.startswith("redriven 4 of 4")
    assert DeadLetter.objects.filter(status="redriven").count() == 6
    assert AuditEvent.objects.filter(action="dead_letter.redriven", actor="system:dlq_redrive").count() == 6
    assert run("--tenant", "tenant-a")[0].startswith("redriven 3 of 3")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "fast"], "--rate must be a number, got 'fast'"),
        (["--rate", "-1"], "--rate must be greater than 0, got '-1'"),
        (["--limit", "0"], "--limit must be greater than 0, got '0'"),
        (["--limit", "2.5"], "--limit must be a whole number, got '2.5'"),
        (["--failure-class", "fatal"], "--failure-class must be one of transient, permanent, got 'fatal'"),
        (["--since", "yesterday"], "--since must be an ISO 8601 date-time"),
        (["--since", "2030-01-01T00:00:00"], "--since must include a UTC offset"),
        (["--tenant", "nobody"], "no tenant with id or name 'nobody'"),
        (["--provider", "a b"], "--provider must be a provider name"),
    ],
)
@pytest.mark.django_db
def test_bad_input_is_one_readable_line(args, message):
    with pytest.raises(CommandError) as raised:
        run(*args)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.django_db
def test_bad_input_exits_non_zero_with_one_line_and_no_traceback(subprocess_env):
    done = manage(subprocess_env, "--rate", "fast")
    assert done.returncode == 1
    assert done.stderr.strip() == "CommandError: --rate must be a number, got 'fast'", done.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # each batch commits, as in production
@pytest.mark.timeout(240)
def test_20k_entries_go_in_batches_of_fixed_cost_at_the_given_rate(tenant_a, monkeypatch):
    hook = factories.provider(tenant_a, "hook-a")
    bulk_dead_letters_sql(tenant_a, hook, 20_000)
    clock = FakeClock()
    real_batch = services._redrive_batch
    per_batch: list[tuple[int, int, float]] = []  # (entries, statements, fake time at the start)

    def counted(ids, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        with CaptureQueriesContext(connection) as ctx:
            result = real_batch(ids, *args, **kwargs)
        per_batch.append((len(ids), len(ctx.captured_queries), clock.now - 1000.0))
        return result

    monkeypatch.setattr(services, "_redrive_batch", counted)
    monkeypatch.setattr(
        services, "redrive_matching", functools.partial(services.redrive_matching, clock=clock, sleep=clock.sleep)
    )
    out, err = run("--tenant", "tenant-a", "--rate", "20000")
    # 20,000/s → 39 waits of 25 ms on the injected clock.
    assert out.startswith("redriven 20000 of 20000 matching entries in 1.0s (40 batches)"), out
    assert "20000/20000" in err
    # 20,000/s → batches of 500 (the cap; a tenth of a second's worth would be 2,000), one every 25 ms.
    assert {size for size, _, _ in per_batch} == {500} and len(per_batch) == 40
    # BEGIN, UPDATE dlq, UPDATE notifications, enqueue (INSERT queue_state + doorbell), INSERT audit_events,
    # COMMIT — the same for the first batch and the 40th.
    assert len({statements for _, statements, _ in per_batch}) == 1 and per_batch[0][1] <= 7
    for n, (_, _, at) in enumerate(per_batch):
        assert at == pytest.approx(n * 500 / 20_000)  # never ahead of the rate
    assert clock.sleeps == pytest.approx([0.025] * 39)
    assert QueueItem.objects.count() == 20_000 and not DeadLetter.objects.filter(status="open").exists()
    assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == 20_000


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_real_run_of_2000_at_1000_per_second_waits_on_the_real_clock(tenant_a):
    bulk_dead_letters_sql(tenant_a, factories.provider(tenant_a, "hook-a"), 2000)
    started = time.monotonic()
    out, _ = run("--rate", "1000")
    took = time.monotonic() - started
    assert out.startswith("redriven 2000 of 2000 matching entries") and "(20 batches)" in out
    assert took >= 1.85, took  # 19 waits of 0.1 s between 20 batches: never ahead of the rate
    assert QueueItem.objects.count() == 2000


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_two_processes_redriving_the_same_entries_at_once_redrive_each_once(tenant_a, subprocess_env):
    entries = dead_letters(tenant_a, factories.provider(tenant_a, "hook-a"), 300)
    procs = [
        subprocess.Popen(  # noqa: S603
            [sys.executable, "manage.py", "dlq_redrive", "--rate", "100"], cwd=ROOT, env=subprocess_env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    counts = [int(out.split()[1]) for out, _ in outputs]
    assert all(counts), outputs  # they ran at the same time …
    assert any("not_open" in out for out, _ in outputs), outputs  # … over the same entries …
    assert sum(counts) == 300, outputs  # … yet each entry was redriven by exactly one of them
    assert all("refused: " in out for out, _ in outputs)
    assert QueueItem.objects.count() == 300
    assert set(QueueItem.objects.values_list("notification_id", flat=True)) == {e.notification_id for e in entries}
    assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == 300


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_ctrl_c_stops_after_the_current_batch(tenant_a, subprocess_env):
    dead_letters(tenant_a, factories.provider(tenant_a, "hook-a"), 300)
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "manage.py", "dlq_redrive", "--rate", "50"], cwd=ROOT, env=subprocess_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert wait_until(lambda: DeadLetter.objects.filter(status="redriven").count() >= 20, timeout=20)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "SIGINT: stopping after the current batch" in err and "CommandError: interrupted" in err
    done = int(out.split()[1])
    assert 20 <= done < 300
    assert DeadLetter.objects.filter(status="redriven").count() == done == QueueItem.objects.count()
    assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == done
