from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # tenant_config: its signals bump the tenant's config_version
        from notifications import lanes, promotion, tenant_config  # noqa: F401
        from queueing import scheduler

        scheduler.register_promotion(promotion.promote)  # due scheduled notifications move to `queued`
        lanes.connect()  # a provider's rate limit is its lane's, in queueing's lane_limits
