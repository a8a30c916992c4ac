from django.apps import AppConfig


class BulkConfig(AppConfig):
    name = "bulk"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from bulk import engine
        from queueing import scheduler

        # Each chunk of a started bulk send is a scheduled job of its own kind.
        scheduler.register_promotion(engine.promote, kind=engine.JOB_KIND)
