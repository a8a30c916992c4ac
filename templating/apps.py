from django.apps import AppConfig


class TemplatingConfig(AppConfig):
    name = "templating"
    verbose_name = "Templates"
    default_auto_field = "django.db.models.BigAutoField"
