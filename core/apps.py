from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import auth_cache, conn_checks

        auth_cache.connect_signals()
        conn_checks.connect()
