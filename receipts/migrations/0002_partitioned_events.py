"""notification_events partitioned by day of `occurred_at` (core.partitions). The model is unchanged:
the key column joins the primary key only in the database."""

from django.db import migrations

from core import partitions

TABLE = "notification_events"
INDEXES = ["CREATE INDEX notif_event_notification_idx ON notification_events (notification_id, occurred_at)"]


def forward(apps, schema_editor):
    partitions.convert(schema_editor, TABLE, "occurred_at", primary_key=["id", "occurred_at"], indexes=INDEXES)


def backward(apps, schema_editor):
    partitions.unconvert(schema_editor, TABLE, primary_key=["id"], indexes=INDEXES)


class Migration(migrations.Migration):

    dependencies = [
        ('receipts', '0001_initial'),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
