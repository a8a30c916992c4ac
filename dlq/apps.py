from django.apps import AppConfig


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = "Dead-letter queue"
    default_auto_field = "django.db.models.BigAutoField"
