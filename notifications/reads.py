"""`GET notifications/{id}` in one statement, its receipt events included.

The ORM's version (select_related of provider and template, the scheduled job's id, the live-lease EXISTS,
a prefetch of the attempts) is two statements, but compiling them costs more Python than the whole
create path: ≈ 1.5 ms a read. Here one fixed, prepared statement returns the row, the names it
shows, the lease and the attempts as arrays, and the instances the serializers read are built
positionally.

The receipt events (`events` of the detail) live in a table of an app above this one (receipts),
which registers how to read them (`register_receipt_events_reader`, STYLE 4a): a function for one
notification, and a LATERAL subquery over the notification row `n` that this statement joins, so that
the detail is still one round trip (a second statement cost ≈ 10 % of a read's CPU, client and server).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from core import hot_sql
from core.models import Tenant, in_mode
from notifications.models import DeliveryAttempt, Notification, NotificationDevice
from providers.models import Provider
from templating.models import Template

_ATTEMPT_COLUMNS = ("number", "provider_id", "started_at", "finished_at", "outcome", "error_class", "error_code",
                    "http_status", "duration_ms")  # fmt: skip


@lru_cache(maxsize=1)
def _columns() -> tuple[str, ...]:
    return tuple(f.attname for f in Notification._meta.concrete_fields)


@lru_cache(maxsize=1)
def _sql() -> str:
    columns = ", ".join(f"n.{name}" for name in _columns())
    attempts = ", ".join(f"array_agg(a.{c} ORDER BY a.number)" for c in _ATTEMPT_COLUMNS)
    attempts += ", array_agg(ap.name ORDER BY a.number)"  # the provider each try went through
    receipt_columns = receipt_join = ""
    if _receipt_events_lateral:
        lateral = _receipt_events_lateral[0]
        receipt_columns = "".join(f", ev.c{i}" for i in range(lateral.columns))
        names = ", ".join(f"c{i}" for i in range(lateral.columns))
        receipt_join = f"\n        LEFT JOIN LATERAL ({lateral.sql}) ev({names}) ON true"
    # The lease test is QueueItemQuerySet.leased(): a live lock on the item makes it `dispatching`.
    return f"""
        SELECT {columns}, p.name, t.key, j.job_id,
               EXISTS (SELECT 1 FROM queue_state q WHERE q.notification_id = n.id
                       AND q.lock_token IS NOT NULL AND q.locked_until > statement_timestamp()) AS leased,
               att.*{receipt_columns}
        FROM notifications n
        JOIN providers p ON p.id = n.provider_id
        LEFT JOIN templates t ON t.id = n.template_id
        LEFT JOIN scheduled_jobs j ON j.notification_id = n.id AND j.tenant_id = n.tenant_id
        LEFT JOIN LATERAL (SELECT {attempts}
                           FROM delivery_attempts a LEFT JOIN providers ap ON ap.id = a.provider_id
                           WHERE a.notification_id = n.id AND a.tenant_id = n.tenant_id
                             -- no try finishes before its notification exists: the day partitions
                             -- older than that (core.partitions) are pruned at run time, not probed
                             AND a.finished_at >= n.created_at - interval '1 day') att ON true{receipt_join}
        WHERE n.id = %s AND n.tenant_id = %s"""  # noqa: S608 - column names from the model, values are parameters


ReceiptEventsReader = Callable[[Notification], list[dict[str, Any]]]


@dataclass(frozen=True)
class ReceiptEventsLateral:
    """How the detail statement reads the receipt events itself: `sql`, a subquery over the notification row
    `n` (joined LEFT JOIN LATERAL … ON true) returning `columns` columns, and `parse`, which turns
    those values into the reader's list."""

    sql: str
    columns: int
    parse: Callable[[Sequence[Any]], list[dict[str, Any]]]


_receipt_events_reader: list[ReceiptEventsReader] = []
_receipt_events_lateral: list[ReceiptEventsLateral] = []


def register_receipt_events_reader(
    reader: ReceiptEventsReader, lateral: ReceiptEventsLateral | None = None
) -> None:
    """`reader(notification)` returns its receipt events as the API shows them ({type, occurred_at, provider,
    details}), oldest first; `lateral`, the same read as part of the detail statement."""
    _receipt_events_reader[:] = [reader]
    _receipt_events_lateral[:] = [lateral] if lateral is not None else []
    _sql.cache_clear()


def receipt_events(n: Notification) -> list[dict[str, Any]]:
    """The notification's receipt events: loaded by `detail()`, else read now."""
    if "receipt_events_shown" not in n.__dict__:
        n.receipt_events_shown = _receipt_events_reader[0](n) if _receipt_events_reader else []
    return n.receipt_events_shown


def detail(tenant: Tenant, notification_id: uuid.UUID) -> Notification | None:
    """The tenant's notification with `provider`, `template`, `scheduled_job_id`, `leased`, its
    attempts and its receipt events (oldest first) loaded, or None (another tenant's id too)."""
    n = _detail(tenant, notification_id)
    if n is not None:
        receipt_events(n)
    return n


def _detail(tenant: Tenant, notification_id: uuid.UUID) -> Notification | None:
    row = hot_sql.fetchone(_sql(), [notification_id, tenant.pk])
    if row is None:
        return None
    if _receipt_events_lateral:
        lateral = _receipt_events_lateral[0]
        events_values, row = row[len(row) - lateral.columns :], row[: len(row) - lateral.columns]
    else:
        events_values = None
    names = _columns()
    values = list(row[: len(names)])
    for index, name in enumerate(names):
        if name in ("context", "metadata", "fallback", "push") and isinstance(values[index], str):
            values[index] = json.loads(values[index])
    n = Notification.from_db(Notification.objects.db, names, values)
    if not in_mode(tenant, n.test):  # the other mode's notification: as if there were none
        return None
    provider_name, template_key, job_id, leased, *attempt_columns = row[len(names):]
    n.leased = leased
    _cache(n, "provider", Provider.from_db(n._state.db, ["id", "name"], [n.provider_id, provider_name]))
    template = Template.from_db(n._state.db, ["id", "key"], [n.template_id, template_key]) if n.template_id else None
    _cache(n, "template", template)
    n.scheduled_job_id = job_id  # the job scheduled_jobs keeps for it, by notification_id (none: None)
    attempts = []
    if attempt_columns[0]:
        *columns, provider_names = attempt_columns
        for values, provider_name in zip(zip(*columns, strict=True), provider_names, strict=True):
            attempt = DeliveryAttempt.from_db(n._state.db, _ATTEMPT_COLUMNS, values)
            attempt.provider_name = provider_name
            attempts.append(attempt)
    n._prefetched_objects_cache = {"attempts": attempts}  # what n.attempts.all() returns
    if events_values is not None:
        n.receipt_events_shown = _receipt_events_lateral[0].parse(events_values)
    return n


def _cache(n: Notification, name: str, value: Any) -> None:  # noqa: ANN401
    Notification._meta.get_field(name).set_cached_value(n, value)


def device_results(n: Notification) -> list[dict[str, Any]]:
    """A push's devices and how each went (notification_devices), in the order they were chosen."""
    rows = NotificationDevice.objects.filter(notification_id=n.pk).order_by("id")
    return [
        {"device_id": str(device_id), "kind": kind, "status": status, "error_code": code or None}
        for device_id, kind, status, code in rows.values_list("device_id", "kind", "status", "error_code")
    ]
