"""delivery_attempts partitioned by day of `finished_at` (core.partitions). The model is unchanged:
the key column joins the primary key and the number's unique constraint only in the database (a
partitioned table's unique indexes must include its key; one recorder per try is the lease's
guarantee, dispatch.delivery)."""

from django.db import migrations

from core import partitions

TABLE = "delivery_attempts"
PARTITIONED = dict(
    primary_key=["id", "finished_at"],
    indexes=[
        "ALTER TABLE delivery_attempts ADD CONSTRAINT attempt_number_unique UNIQUE (notification_id, number, finished_at)",
        "CREATE INDEX attempt_finished_idx ON delivery_attempts (finished_at)",
    ],
)
PLAIN = dict(
    primary_key=["id"],
    indexes=[
        "ALTER TABLE delivery_attempts ADD CONSTRAINT attempt_number_unique UNIQUE (notification_id, number)",
        "CREATE INDEX attempt_finished_idx ON delivery_attempts (finished_at)",
    ],
)


def forward(apps, schema_editor):
    partitions.convert(schema_editor, TABLE, "finished_at", **PARTITIONED)


def backward(apps, schema_editor):
    partitions.unconvert(schema_editor, TABLE, **PLAIN)


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0016_routing'),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
