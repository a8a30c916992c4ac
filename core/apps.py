from django.apps import AppConfig
from django.db.models.signals import post_migrate


class CoreConfig(AppConfig):
    name = "core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import auth_cache, conn_checks

        auth_cache.connect_signals()
        conn_checks.connect()
        post_migrate.connect(_keep_partitions_ahead, sender=self)


def _keep_partitions_ahead(sender, using: str = "default", **kwargs) -> None:  # noqa: ANN001
    """After every `migrate`: the day partitions of today and the days ahead exist (core.partitions)."""
    from core import partitions

    partitions.ensure_all(using=using)
