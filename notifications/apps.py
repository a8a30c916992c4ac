from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from notifications import tenant_config  # its signals bump the tenant's config_version
        from recipients import services as recipients

        recipients.read_category_keys_with(tenant_config.category_keys)  # from this process's copy
