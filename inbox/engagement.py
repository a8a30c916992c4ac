"""A subscriber's first `seen` and `read` of an item: the notification's events (types `seen`, `read`,
written by receipts, which owns them and registers its writer here at start-up) and the event
webhooks `notification.seen` / `notification.read` (events.emit), in the transaction that changed
the item."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from events.emit import emit_notification_events

Writer = Callable[[Any, Any, Sequence[tuple[Any, str]]], None]
_writers: list[Writer] = []


def register(writer: Writer) -> None:
    """`writer(cursor, tenant_id, [(notification id, "seen" | "read"), ...])` writes them as the
    notifications' events."""
    _writers[:] = [writer]


def record(cursor: Any, tenant_id: Any, engaged: Sequence[tuple[Any, str]]) -> None:  # noqa: ANN401
    if not engaged:
        return
    for writer in _writers:
        writer(cursor, tenant_id, engaged)
    emit_notification_events(cursor, [(nid, f"notification.{kind}", {}) for nid, kind in engaged])
