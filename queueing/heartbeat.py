"""The worker registry: each long-running process records who it is and when it was last alive."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from django.db.models import F
from django.db.models.functions import Now

from queueing.models import Worker


def register(kind: str, queues: Sequence[str] = ()) -> Worker:
    return Worker.objects.create(kind=kind, host=socket.gethostname(), pid=os.getpid(), queues=list(queues))


def beat(worker: Worker, processed: int = 0, reconnects: int | None = None) -> None:
    """One UPDATE: last_seen from the database clock, processed counter added atomically, and the
    process's reconnect count (core.db_faults) as it is now."""
    changes = {"last_seen": Now(), "processed": F("processed") + processed}
    if reconnects is not None:
        changes["reconnects"] = reconnects
    Worker.objects.filter(pk=worker.pk).update(**changes)


def stop(worker: Worker) -> None:
    Worker.objects.filter(pk=worker.pk).update(last_seen=Now(), stopped_at=Now())
