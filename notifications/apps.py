from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from notifications import (
            circuits,
            tenant_config,  # noqa: F401 - its signals bump the tenant's config_version
        )
        from providers.models import show_with

        show_with("circuit_state", circuits.state_annotation)  # the API and the console show the breaker
