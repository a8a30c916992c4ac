"""Figures that read beyond the queue, for the console dashboard, `queue_stats` and /metrics:
attempts per minute (notifications) and open dead letters (dlq). The queue's own figures are
`queueing.stats`; these live above every app they read."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.db.models.functions import Now, TruncMinute
from django.utils import timezone

from dlq.models import DeadLetter
from notifications.models import AttemptOutcome, DeliveryAttempt
from queueing.stats import Size, TenantIds, capped_count, scoped

# --- throughput ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Minute:
    start: datetime
    delivered: int = 0
    transient: int = 0
    permanent: int = 0

    @property
    def failed(self) -> int:
        return self.transient + self.permanent


def throughput(tenant_ids: TenantIds = None, *, minutes: int = 60, now: datetime | None = None) -> list[Minute]:
    """Attempts per minute over the last `minutes` by outcome, oldest first, zero-filled. One query.

    The window is cut with the database clock; the buckets are labelled from `now` (default: this
    process's clock), which only decides where an empty minute is drawn.
    """
    rows = (
        scoped(DeliveryAttempt.objects.all(), tenant_ids)
        .filter(finished_at__gte=Now() - timedelta(minutes=minutes))
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute")
        .annotate(
            delivered=Count("pk", filter=Q(outcome=AttemptOutcome.DELIVERED)),
            transient=Count("pk", filter=Q(outcome=AttemptOutcome.TRANSIENT_ERROR)),
            permanent=Count("pk", filter=Q(outcome=AttemptOutcome.PERMANENT_ERROR)),
        )
        .order_by("minute")
    )
    found = {r["minute"]: r for r in rows}
    end = (now or timezone.now()).replace(second=0, microsecond=0)
    if found:
        end = max(end, max(found))
    out = []
    for i in range(minutes - 1, -1, -1):
        start = end - timedelta(minutes=i)
        r = found.get(start)
        out.append(Minute(start, r["delivered"], r["transient"], r["permanent"]) if r else Minute(start))
    return out



def dlq_open(tenant_ids: TenantIds = None, cap: int = 100_000) -> Size:
    """Open dead letters (dlq_status_recent_idx / dlq_tenant_status_idx serve the count)."""
    return capped_count(scoped(DeadLetter.objects.open(), tenant_ids), cap)


