from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "events"
    verbose_name = "Event webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import retention
        from events.emit import emit_suppressed
        from queueing import janitor
        from recipients import suppressions

        # Churning at the queue's pace: every event delivery is claimed and then recorded out of
        # event_delivery_due_idx (unvacuumed, with autovacuum off, the event lane's claim stepped over every
        # delivery ever made: 17 ms a claim after 40,000); events are updated once (fanned out) out of
        # event_fanout_pending_idx, and batches of outcomes deleted as opened. Only the event lane reads
        # these tables, and it holds back while its process has a backlog of notifications: their VACUUM
        # and ANALYZE wait for the backlog to go (queueing.janitor).
        janitor.register(
            ("event_deliveries", "events", "event_outcome_batches"),
            deferred=("events", "event_deliveries", "event_attempts", "event_outcome_batches"),
        )

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
