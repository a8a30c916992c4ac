from django.apps import AppConfig


class DlqConfig(AppConfig):
    name = "dlq"
    default_auto_field = "django.db.models.BigAutoField"
