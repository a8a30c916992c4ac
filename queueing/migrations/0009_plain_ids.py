# The queue carries what it queues by opaque ids: queue_state.notification_id and provider_id and
# scheduled_jobs.notification_id become plain columns (no foreign key, no model relation to a higher
# app). queue_state's relations were already db_constraint=False, so only scheduled_jobs loses a
# constraint; columns, indexes and unique constraints stay as they are.

from django.db import migrations, models

# (table, column): every foreign key from these columns goes.
UNCOUPLED = (("scheduled_jobs", "notification_id"), ("queue_state", "notification_id"), ("queue_state", "provider_id"))


def drop_foreign_keys(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        for table, column in UNCOUPLED:
            cursor.execute(
                """SELECT c.conname FROM pg_constraint c
                   JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
                   WHERE c.contype = 'f' AND c.conrelid = to_regclass(%s) AND a.attname = %s""",
                [table, column],
            )
            for (name,) in cursor.fetchall():
                schema_editor.execute(
                    f"ALTER TABLE {schema_editor.quote_name(table)} DROP CONSTRAINT {schema_editor.quote_name(name)}"
                )


class Migration(migrations.Migration):

    dependencies = [
        ('queueing', '0008_lane_limits'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # The same columns, unique constraints and indexes, under plain fields.
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='queueitem',
                    name='queue_state_one_live_item_per_notification',
                ),
                migrations.RemoveIndex(
                    model_name='queueitem',
                    name='queue_state_lane_idx',
                ),
                migrations.RemoveField(
                    model_name='queueitem',
                    name='notification',
                ),
                migrations.RemoveField(
                    model_name='queueitem',
                    name='provider',
                ),
                migrations.RemoveField(
                    model_name='scheduledjob',
                    name='notification',
                ),
                migrations.AddField(
                    model_name='queueitem',
                    name='notification_id',
                    field=models.UUIDField(),
                ),
                migrations.AddField(
                    model_name='queueitem',
                    name='provider_id',
                    field=models.BigIntegerField(blank=True, null=True),
                ),
                migrations.AddField(
                    model_name='scheduledjob',
                    name='notification_id',
                    field=models.UUIDField(unique=True),
                ),
                migrations.AddIndex(
                    model_name='queueitem',
                    index=models.Index(condition=models.Q(('rate_limited', True), ('ready', True)), fields=['provider_id', '-priority', 'enqueued_at', 'item_id'], name='queue_state_lane_idx'),
                ),
                migrations.AddConstraint(
                    model_name='queueitem',
                    constraint=models.UniqueConstraint(fields=('notification_id',), name='queue_state_one_live_item_per_notification'),
                ),
            ],
            # Going back leaves the foreign key out: nothing needs it.
            database_operations=[migrations.RunPython(drop_foreign_keys, migrations.RunPython.noop)],
        ),
    ]
