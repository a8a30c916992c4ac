from django.apps import AppConfig


class ReceiptsConfig(AppConfig):
    name = "receipts"
    verbose_name = "Delivery receipts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import retention
        from inbox import engagement
        from notifications import reads
        from receipts import vendors  # noqa: F401  (each vendor module registers its adapter)
        from receipts.followups import follow_up
        from receipts.reads import RECEIPT_EVENTS_LATERAL, receipt_events_of
        from receipts.services import AFTER_APPLY, record_engagement

        engagement.register(record_engagement)  # an inbox item's first seen / read as notification events
        reads.register_receipt_events_reader(receipt_events_of, RECEIPT_EVENTS_LATERAL)
        # a vendor retries a receipt for hours or days, never past retention
        retention.register(
            retention.RetainedTable("receipt_dedup", "created_at < %(cutoff)s", "receipt de-duplication key(s)")
        )
        from providers.simulator import RECEIPT_SINK
        from receipts.simulated import apply_simulated

        if apply_simulated not in RECEIPT_SINK:
            RECEIPT_SINK.append(apply_simulated)  # test mode: the simulator's receipts, as a vendor's
        if follow_up not in AFTER_APPLY:
            AFTER_APPLY.append(follow_up)  # suppressions and outbound events, in the apply's transaction
