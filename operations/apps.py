from __future__ import annotations

from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """Operator workflows across the domain apps (retention, key rotation): above `notifications`,
    `dlq` and `queueing`, which never import it; its commands only parse arguments and call it."""

    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"
