"""Fanning a workflow trigger out to a topic: the handler the scheduler runs for due jobs of kind
`fanout`.

A trigger to a topic (workflows.services.trigger_topic) records a fan-out (its boundary in the
topic's membership sequence, recipients.topics) and one job due now. A scheduler takes that job
FOR UPDATE SKIP LOCKED and creates runs chunk after chunk, each chunk one transaction: one
`INSERT … SELECT` of the next members in id order (never the whole topic in memory, nor a chunk's
ids in Python) into `workflow_runs`, narrow (the data, definition and step states stay the fan-out's,
workflows.models), with a `workflow_share` job for each engine batch of them (workflows.engine.BATCH
runs wait on one job together), which also moves the fan-out's cursor past them. A scheduler killed
anywhere loses at most the chunk it had not committed: the job is pending again and a peer (or its
restart) goes on from the cursor; the unique (trigger_id, subscriber) key makes a repeated chunk
harmless. The last chunk (fewer members than a chunk) ends the
fan-out and its job together.

A call works for a fair share of the scheduler and then hands it back, so the scheduler's other kinds
(due notifications, run steps: the fan-out's own and everyone else's) keep their turn while a
broadcast fans out: as long as those took since the fan-out's last turn, at least
OMNIPOST_FANOUT_BUDGET_SECONDS and at most SHARE_CAP times it. The fan-out's own shares wait for
its last chunk (`promote_shares`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connections, transaction
from django.db.models.functions import Now

from queueing import schedule, scheduler
from recipients import topics
from workflows import engine, statements
from workflows.engine import BATCH, SHARE_KIND
from workflows.models import Fanout

logger = logging.getLogger("omnipost.workflows")

JOB_KIND = "fanout"


def chunk_size() -> int:
    return int(settings.OMNIPOST_FANOUT_CHUNK)


def promote(batch_size: int, using: str, *, clock: Callable[[], float] = time.monotonic) -> scheduler.Promotion:
    """Fan out chunks of due fan-outs for this turn's share of the scheduler (`budget`)
    (queueing.scheduler.PromotionHandler); `promoted` counts the fan-outs finished."""
    if not scheduler.any_due(JOB_KIND, using=using):  # one statement when none is due (the usual case)
        _turn_ended.pop(using, None)
        return scheduler.Promotion(0, 0)
    deadline = clock() + budget(_turn_ended.get(using), clock())
    finished = 0
    while clock() < deadline:
        outcome = chunk_once(using)
        if outcome is None:
            break
        finished += outcome
    _turn_ended[using] = clock()
    return scheduler.Promotion(finished, 0)


def promote_shares(batch_size: int, using: str) -> scheduler.Promotion:
    """The runs of a due fan-out share (workflows.engine.promote_shares), unless a due fan-out waits
    for this scheduler: a broadcast's runs are all made first (some 50,000 a second), its sends
    after, so that its shares do not halve the fan-out's pace. A peer scheduler, finding the fan-out
    held by the one chunking it, sends meanwhile. One statement when no share is due (the usual case)."""
    if not scheduler.any_due(SHARE_KIND, using=using) or scheduler.any_due(JOB_KIND, using=using, takeable=True):
        return scheduler.Promotion(0, 0)
    return engine.promote_shares(batch_size, using, due=True)


SHARE_CAP = 4.0
_turn_ended: dict[str, float] = {}  # per database alias: when this scheduler's last fan-out turn ended


def budget(last_turn_ended: float | None, now: float) -> float:
    """Seconds of fan-out for this turn: as long as the scheduler's other work took since the last turn
    ended (a fair half), within [OMNIPOST_FANOUT_BUDGET_SECONDS, SHARE_CAP times it]."""
    least = float(settings.OMNIPOST_FANOUT_BUDGET_SECONDS)
    if last_turn_ended is None:
        return least
    return min(max(now - last_turn_ended, least), SHARE_CAP * least)


def chunk_once(using: str = "default", *, chunk: int | None = None) -> int | None:
    """One chunk of one due fan-out, in one transaction: 1 when it finished the fan-out, 0 when more
    remain, None when no fan-out is due (or every due one is held by a peer)."""
    size = chunk or chunk_size()
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute(scheduler.due_jobs_sql(JOB_KIND), {"n": 1})
            row = cursor.fetchone()
        if row is None:
            return None
        job_id, fanout_id, _ = row
        fanout = Fanout.objects.using(using).select_for_update().filter(pk=fanout_id).first()
        if fanout is None or fanout.status != Fanout.Status.RUNNING:  # its workflow was deleted, or cancelled
            schedule.settle_jobs([], [job_id], using=using)
            return 0
        if not topics.hold_for_fanout(fanout.topic_id, using=using):  # pragma: no cover - its row waits for us
            fanout.stop(using=using)
            topics.end_fanout(fanout.topic_id, using=using)
            schedule.settle_jobs([], [job_id], using=using)
            return 0
        started = time.monotonic()
        read = statements.fan_out_chunk(fanout, topics.members_sql(), size, SHARE_KIND, BATCH, using=using)
        if read >= size:
            logger.debug("fan-out %s: %d runs (%.3fs)", fanout.pk, read, time.monotonic() - started)
            return 0
        Fanout.objects.using(using).filter(pk=fanout.pk).update(status=Fanout.Status.COMPLETED, finished_at=Now())
        topics.end_fanout(fanout.topic_id, using=using)
        schedule.settle_jobs([job_id], [], using=using)
    logger.info("fan-out %s to topic %s done: %d runs in %d chunks", fanout.pk, fanout.topic_key,
                fanout.created, fanout.chunks + 1)  # fmt: skip
    return 1


_FIGURES = """SELECT count(*), coalesce(sum(ceil(greatest(total - created, 0)::numeric / %(chunk)s)), 0)::bigint,
       coalesce(sum(created / greatest(extract(epoch FROM now() - created_at), 0.001)), 0)::float8
FROM workflow_fanouts WHERE status = 'running'"""


def figures(using: str = "default") -> tuple[int, int, float]:
    """(fan-outs running, chunks still to create, their runs created per second since their triggers),
    from the running fan-outs only (a partial index): /metrics."""
    with connections[using].cursor() as cursor:
        cursor.execute(_FIGURES, {"chunk": chunk_size()})
        running, chunks, rate = cursor.fetchone()
    return int(running), int(chunks), float(rate)
