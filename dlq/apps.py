from django.apps import AppConfig


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = "Dead-letter queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from dlq.models import DeadLetter
        from notifications.admin import register_status_source
        from notifications.models import Status

        # The admin's failed / dead_lettered filters read this table's newest entries (dlq_console_*_idx):
        # the record statement writes an entry for both.
        register_status_source(
            (Status.FAILED, Status.DEAD_LETTERED), lambda: DeadLetter.objects.order_by("-created_at", "-id")
        )
