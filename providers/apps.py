from django.apps import AppConfig


class ProvidersConfig(AppConfig):
    name = "providers"
    verbose_name = "Providers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from providers import lanes

        lanes.connect()  # a provider's rate limit is its lane's, in queueing's lane_limits
