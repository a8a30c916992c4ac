from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import retention
        from notifications import promotion, tenant_config  # noqa: F401 - tenant_config: its signals bump config_version
        from providers import ssrf
        from queueing import scheduler
        from recipients import devices
        from recipients import services as recipients

        scheduler.register_promotion(promotion.promote)  # due scheduled notifications move to `queued`
        recipients.read_category_keys_with(tenant_config.category_keys)  # from this process's copy
        devices.check_endpoint_with(ssrf.check_host)  # Web Push endpoints at registration: the SSRF rules
        # a provider's receipts come within days of the send, never past retention
        retention.register(
            retention.RetainedTable("provider_messages", "created_at < %(cutoff)s", "provider message id(s)"),
            # a push's devices once settled: a pending one may belong to a notification scheduled far ahead
            retention.RetainedTable(
                "notification_devices", "updated_at < %(cutoff)s AND status <> 'pending'", "push device result(s)"
            ),
        )
