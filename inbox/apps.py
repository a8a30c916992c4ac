from django.apps import AppConfig


class InboxConfig(AppConfig):
    name = "inbox"
    verbose_name = "In-app inbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import retention

        # `manage.py prune`: items past their notification's `ttl_seconds` (the database's clock), and
        # items read or archived before the retention cutoff; an unread item stays however old. The
        # counts follow through the table's delete trigger (migration 0003).
        retention.register(
            retention.RetainedTable(
                "inbox_items",
                "expires_at <= now() OR read_at < %(cutoff)s OR archived_at < %(cutoff)s",
                "inbox item(s)",
            )
        )
