from __future__ import annotations

from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    """Optional: `manage.py omnipost_bench` and what it runs. Production code never imports it."""

    name = "benchmarks"
