"""One B-tree a delivery attempt instead of three (≈ 145 of the 827 WAL bytes a delivery).

- The primary key is `attempt_number_unique` (notification_id, number, finished_at), every reader's
  key (the detail, the DLQ, receipts, prune all find attempts by notification), instead of a second
  unique index on (id, finished_at) that nothing read. Django keeps `id` as its key; the column
  stays, filled from its sequence, without an index.
- `attempt_finished_idx`, read only by the dashboard's last hour, becomes a BRIN index (see the model).

Both rebuild indexes under the migration's lock on `delivery_attempts`: on a large table, run it in
a quiet hour."""

import django.contrib.postgres.indexes
from django.db import migrations

from core import partitions

TABLE = "delivery_attempts"


def key_by_number(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("ALTER TABLE delivery_attempts DROP CONSTRAINT delivery_attempts_pkey")
        cursor.execute("ALTER TABLE delivery_attempts DROP CONSTRAINT attempt_number_unique")
        cursor.execute("ALTER TABLE delivery_attempts ADD CONSTRAINT attempt_number_unique "
                       "PRIMARY KEY (notification_id, number, finished_at)")
        partitions.name_partition_indexes(cursor, TABLE)


def key_by_id(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("ALTER TABLE delivery_attempts DROP CONSTRAINT attempt_number_unique")
        cursor.execute("ALTER TABLE delivery_attempts ADD CONSTRAINT delivery_attempts_pkey PRIMARY KEY (id, finished_at)")
        cursor.execute("ALTER TABLE delivery_attempts ADD CONSTRAINT attempt_number_unique "
                       "UNIQUE (notification_id, number, finished_at)")
        partitions.name_partition_indexes(cursor, TABLE)


def name_indexes(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        partitions.name_partition_indexes(cursor, TABLE)
        for partition in partitions.partitions(TABLE, using=schema_editor.connection.alias):
            partitions.unsummarize_if_empty(cursor, partition.name)


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0026_channel_in_app'),
    ]

    operations = [
        migrations.RunPython(key_by_number, key_by_id, elidable=False),
        migrations.RemoveIndex(
            model_name='deliveryattempt',
            name='attempt_finished_idx',
        ),
        migrations.AddIndex(
            model_name='deliveryattempt',
            index=django.contrib.postgres.indexes.BrinIndex(fields=['finished_at'], name='attempt_finished_idx'),
        ),
        migrations.RunPython(name_indexes, name_indexes, elidable=False),
    ]
