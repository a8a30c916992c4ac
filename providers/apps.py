from django.apps import AppConfig


class ProvidersConfig(AppConfig):
    name = "providers"
    verbose_name = "Providers"
    default_auto_field = "django.db.models.BigAutoField"
