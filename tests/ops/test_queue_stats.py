"""`manage.py queue_stats`: the queue figures, throughput, dead letters and workers as a table or JSON."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt
from queueing.models import QueueItem, Worker
from tests import factories

pytestmark = pytest.mark.django_db


def stats(*args: str) -> str:
    out = io.StringIO()
    call_command("queue_stats", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def busy(tenant_a, tenant_b):
    hook_a, hook_b = factories.provider(tenant_a, "hook"), factories.provider(tenant_b, "hook")
    factories.queued(tenant_a, hook_a, 3, priority=9)
    factories.queued(tenant_a, hook_a, 2, priority=0, queue_name="bulk")
    factories.queued(tenant_b, hook_b, 4, priority=5, delay=300)
    leased = QueueItem.objects.filter(queue_name="default", priority=9).first()
    QueueItem.objects.filter(pk=leased.pk).update(lock_token="00000000-0000-0000-0000-000000000001",
                                                  locked_until=timezone.now() + timedelta(seconds=30),
                                                  available_at=timezone.now() + timedelta(seconds=30))
    QueueItem.objects.filter(queue_name="default", priority=9).exclude(pk=leased.pk).update(
        enqueued_at=timezone.now() - timedelta(minutes=3)
    )
    now = timezone.now()
    done = factories.notifications(tenant_a, hook_a, 2, status="delivered")
    DeliveryAttempt.objects.bulk_create(
        DeliveryAttempt(tenant=tenant_a, notification=n, number=1, provider=hook_a, started_at=now, finished_at=now,
                        outcome="delivered") for n in done
    )  # fmt: skip
    dead = factories.notifications(tenant_b, hook_b, 1, status="dead_lettered")[0]
    DeadLetter.objects.create(tenant=tenant_b, notification=dead, failure_class="transient", failure_reason="503",
                              attempt_count=8)
    Worker.objects.create(kind="dispatcher", host="box-1", pid=101, processed=1234, queues=["default"])
    stale = Worker.objects.create(kind="dispatcher", host="box-2", pid=102)
    Worker.objects.filter(pk=stale.pk).update(last_seen=now - timedelta(minutes=10))


def test_table(busy):
    out = stats()
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:6] == ["queue", "depth", "ready", "leased", "delayed", "oldest"]
    assert header[7:] == [f"p{p}" for p in range(9, -1, -1)]
    rows = {line.split()[0]: line.split() for line in lines[1:4]}
    # queue, depth, ready, leased, delayed, oldest ready, p9 … p0
    assert rows["default"][:5] == ["default", "7", "2", "1", "4"]
    assert rows["default"][5].endswith("m") and 3.0 <= float(rows["default"][5][:-1]) < 4
    assert rows["default"][6] == "3" and rows["default"][10] == "4"  # p9, p5
    assert rows["bulk"][:5] == ["bulk", "2", "2", "0", "0"] and rows["bulk"][-1] == "2"  # p0
    assert rows["(all)"][:5] == ["(all)", "9", "4", "1", "4"]
    assert "attempts, last hour: 2 delivered, 0 transient errors, 0 permanent errors" in out
    assert "dead letters open: 1" in out
    assert "workers: 1 live, 1 stale" in out
    worker_lines = [line.split() for line in lines if "box-" in line]
    assert ["dispatcher", "box-1:101", "live"] == worker_lines[0][:3] and worker_lines[0][-2:] == ["1,234", "default"]
    assert worker_lines[1][2] == "STALE" and worker_lines[1][3].endswith("m")


def test_json_and_tenant_scope(busy, tenant_b):
    data = json.loads(stats("--json"))
    assert {q["queue"]: q["depth"] for q in data["queues"]} == {"default": 7, "bulk": 2}
    assert data["attempts_last_hour"] == {"delivered": 2, "transient_error": 0, "permanent_error": 0}
    assert data["dlq_open"] == {"count": 1, "exact": True}
    assert [w["alive"] for w in data["workers"]] == [True, False]

    scoped = json.loads(stats("--json", "--tenant", "tenant-b"))
    assert [(q["queue"], q["depth"], q["delayed"]) for q in scoped["queues"]] == [("default", 4, 4)]
    assert scoped["attempts_last_hour"]["delivered"] == 0 and scoped["dlq_open"]["count"] == 1
    assert json.loads(stats("--json", "--tenant", str(tenant_b.pk)))["queues"] == scoped["queues"]


def test_empty_and_unknown_tenant():
    out = stats()
    assert out.startswith("no live items in any queue")
    assert "workers: 0 live, 0 stale" in out
    with pytest.raises(CommandError, match="no tenant with id or name 'nobody'"):
        stats("--tenant", "nobody")
