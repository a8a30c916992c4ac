from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import retention
        from queueing import scheduler
        from templating import services as templates
        from workflows import engine, fanout, sequences, statements

        # A run waiting on a delay (or its first step) is a scheduled job of its own kind.
        scheduler.register_promotion(engine.promote, kind=engine.JOB_KIND)
        # A trigger to a topic fans out in chunks, resumable, as a job of its own kind.
        scheduler.register_promotion(fanout.promote, kind=fanout.JOB_KIND)
        # A fan-out's runs wait in shares of up to engine.BATCH on jobs of their own kind, promoted in
        # their own turn (engine.SHARE_KIND) once this scheduler's fan-out turn makes no more chunks.
        scheduler.register_promotion(fanout.promote_shares, kind=engine.SHARE_KIND)
        # Past retention: finished runs, closed digest windows no unfinished run still leads, and
        # throttle windows over for longer than the longest window a step may have.
        retention.register(*statements.RETAINED)
        templates.check_use_with(sequences.uses_template)  # a sequence's step names its template by key
