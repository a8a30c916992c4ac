from django.apps import AppConfig


class RecipientsConfig(AppConfig):
    name = "recipients"
    verbose_name = "Recipients"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from queueing import scheduler
        from recipients import topics

        # A deleted topic's memberships go in chunks, resumable, as a job of its own kind.
        scheduler.register_promotion(topics.purge, kind=topics.DELETE_KIND)
