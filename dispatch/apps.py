from __future__ import annotations

from django.apps import AppConfig


class DispatchConfig(AppConfig):
    """The dispatcher process: claim → send → record. It composes the queue (queueing), the
    domain (notifications) and dead letters (dlq); nothing below imports it."""

    name = "dispatch"
