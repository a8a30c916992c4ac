from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "events"
    verbose_name = "Event webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import retention
        from events.emit import emit_suppressed
        from recipients import suppressions

        suppressions.on_suppressed(emit_suppressed)  # recipient.suppressed, in the suppression's transaction
        # past retention: attempts, finished deliveries, then the events no pending delivery still needs
        # (an endpoint's undelivered events stay for its `recover`)
        retention.register(
            retention.RetainedTable("event_attempts", "attempted_at < %(cutoff)s", "event attempt(s)"),
            retention.RetainedTable(
                "event_deliveries", "created_at < %(cutoff)s AND status <> 'pending'", "finished event delivery(s)"
            ),
            retention.RetainedTable(
                "events",
                # fanned out, and no delivery left that the row above keeps: pending, or newer than the
                # cutoff (a recover)
                "created_at < %(cutoff)s AND NOT fanout_pending"
                " AND NOT EXISTS (SELECT 1 FROM event_deliveries d WHERE d.event_id = events.id"
                " AND d.endpoint_id IN (SELECT ep.id FROM event_endpoints ep WHERE ep.tenant_id = events.tenant_id)"
                " AND (d.status = 'pending' OR d.created_at >= %(cutoff)s))",
                "event(s)",
            ),
        )  # fmt: skip
