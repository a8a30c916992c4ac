from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from providers.models import show_with
        from routing import circuits

        show_with("circuit_state", circuits.state_annotation)  # the API and the console show the breaker
