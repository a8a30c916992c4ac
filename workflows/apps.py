from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from queueing import scheduler
        from workflows import engine, fanout

        # A run waiting on a delay (or its first step) is a scheduled job of its own kind.
        scheduler.register_promotion(engine.promote, kind=engine.JOB_KIND)
        # A trigger to a topic fans out in chunks, resumable, as a job of its own kind.
        scheduler.register_promotion(fanout.promote, kind=fanout.JOB_KIND)
