from __future__ import annotations

from django.apps import AppConfig


class OpsConfig(AppConfig):
    """What operators look at and run, reading every app: /metrics, /healthz, /readyz, the admin
    dashboard, `queue_stats` and `run_all`."""

    name = "omnipost_site.ops"
    label = "ops"
