from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "events"
    verbose_name = "Event webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from events.emit import emit_suppressed
        from notifications import suppressions

        suppressions.on_suppressed(emit_suppressed)  # recipient.suppressed, in the suppression's transaction
