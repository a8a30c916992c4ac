from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from notifications import circuits, tenant_config  # tenant_config's signals bump the config_version
        from providers.models import show_with
        from recipients import services as recipients

        show_with("circuit_state", circuits.state_annotation)  # the API and the console show the breaker
        recipients.read_category_keys_with(tenant_config.category_keys)  # from this process's copy
