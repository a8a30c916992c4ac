from django.apps import AppConfig


class InboxConfig(AppConfig):
    name = "inbox"
    verbose_name = "In-app inbox"
    default_auto_field = "django.db.models.BigAutoField"
