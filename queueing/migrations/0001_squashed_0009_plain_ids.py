# queueing's tables as 0001–0009 leave them, built without a dependency on any app above queueing
# (0001 made foreign keys to notifications, which 0009 removes): a fresh database migrates queueing
# before, and independently of, the domain. A database that has applied some of 0001–0009 goes on
# with them; one that has applied all counts this one as applied too.
# Columns are in the order the history made them, so both paths end in the same schema.

import django.db.models.deletion
import django.db.models.functions.datetime
import uuid
from django.db import migrations, models

# queue_state turns over constantly (insert, update, delete per item): vacuumed early and without
# throttling, so dead index entries do not pile up in front of the claim's index scans (0002). A claim
# rewrites every row of a page within moments: half of each page is left free so those rewrites stay
# HOT (0003; at 70 % only about 40 % of claims were HOT).
QUEUE_STATE_STORAGE = (
    "ALTER TABLE queue_state SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0)",
    "ALTER TABLE queue_state SET (fillfactor = 50)",
)


def tune_queue_state(apps, schema_editor):
    for statement in QUEUE_STATE_STORAGE:
        schema_editor.execute(statement)


class Migration(migrations.Migration):

    replaces = [
        ('queueing', '0001_initial'),
        ('queueing', '0002_hot_foreign_keys'),
        ('queueing', '0003_lean_indexes'),
        ('queueing', '0004_claim_ready_state'),
        ('queueing', '0005_worker_reconnects'),
        ('queueing', '0006_tenant_claim_indexes'),
        ('queueing', '0007_tenant_idx_without_priority'),
        ('queueing', '0008_lane_limits'),
        ('queueing', '0009_plain_ids'),
    ]

    initial = True

    dependencies = [
        ('core', '0004_tenant_weight'),
    ]

    operations = [
        migrations.CreateModel(
            name='RateBucket',
            fields=[
                ('key', models.CharField(max_length=100, primary_key=True, serialize=False)),
                ('rate', models.FloatField()),
                ('effective_rate', models.FloatField()),
                ('burst', models.FloatField()),
                ('tokens', models.FloatField()),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('decreased_at', models.DateTimeField(blank=True, null=True)),
                ('increased_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'rate_limit_buckets',
            },
        ),
        migrations.CreateModel(
            name='Worker',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('kind', models.CharField(choices=[('dispatcher', 'Dispatcher'), ('scheduler', 'Scheduler')], max_length=12)),
                ('host', models.CharField(max_length=255)),
                ('pid', models.PositiveIntegerField()),
                ('queues', models.JSONField(blank=True, default=list)),
                ('started_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('last_seen', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('stopped_at', models.DateTimeField(blank=True, null=True)),
                ('processed', models.PositiveBigIntegerField(default=0)),
                ('reconnects', models.PositiveIntegerField(default=0)),
            ],
            options={
                'db_table': 'workers',
                'ordering': ['-last_seen'],
            },
        ),
        migrations.CreateModel(
            name='QueueItem',
            fields=[
                ('item_id', models.BigAutoField(primary_key=True, serialize=False)),
                ('queue_name', models.CharField(default='default', max_length=100)),
                ('priority', models.PositiveSmallIntegerField(default=5)),
                ('payload_json', models.JSONField(default=dict)),
                ('lock_token', models.UUIDField(blank=True, null=True)),
                ('locked_until', models.DateTimeField(blank=True, null=True)),
                ('enqueued_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('available_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('rate_limited', models.BooleanField(default=False)),
                ('notification_id', models.UUIDField()),
                ('provider_id', models.BigIntegerField(blank=True, null=True)),
                ('tenant', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
                ('ready', models.BooleanField(db_default=True)),
            ],
            options={
                'db_table': 'queue_state',
                'indexes': [
                    models.Index(condition=models.Q(('priority__gte', 0), ('rate_limited', False), ('ready', True)), fields=['-priority', 'enqueued_at', 'item_id'], name='queue_state_ready_idx'),
                    models.Index(condition=models.Q(('rate_limited', False), ('ready', True)), fields=['queue_name', '-priority', 'enqueued_at', 'item_id'], name='queue_state_ready_queue_idx'),
                    models.Index(condition=models.Q(('rate_limited', False), ('ready', True)), fields=['tenant', '-priority', 'enqueued_at', 'item_id'], name='queue_state_tenant_idx'),
                    models.Index(condition=models.Q(('rate_limited', False), ('ready', True)), fields=['tenant', 'enqueued_at', 'item_id'], name='queue_state_tenant_aged_idx'),
                    models.Index(condition=models.Q(('priority__gte', 0), ('rate_limited', False), ('ready', True)), fields=['enqueued_at', 'item_id'], name='queue_state_starving_all_idx'),
                    models.Index(condition=models.Q(('rate_limited', False), ('ready', True)), fields=['queue_name', 'enqueued_at', 'item_id'], name='queue_state_starving_idx'),
                    models.Index(condition=models.Q(('rate_limited', True), ('ready', True)), fields=['provider_id', '-priority', 'enqueued_at', 'item_id'], name='queue_state_lane_idx'),
                    models.Index(condition=models.Q(('ready', False)), fields=['available_at'], name='queue_state_delayed_idx'),
                ],
                'constraints': [
                    models.UniqueConstraint(fields=('notification_id',), name='queue_state_one_live_item_per_notification'),
                    models.CheckConstraint(condition=models.Q(('priority__gte', 0), ('priority__lte', 9)), name='queue_state_priority_0_9'),
                ],
            },
        ),
        migrations.CreateModel(
            name='ScheduledJob',
            fields=[
                ('job_id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('run_at', models.DateTimeField()),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('executed', 'Executed'), ('cancelled', 'Cancelled')], default='pending', max_length=10)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('executed_at', models.DateTimeField(blank=True, null=True)),
                ('notification_id', models.UUIDField(unique=True)),
                ('tenant', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
            ],
            options={
                'db_table': 'scheduled_jobs',
                'indexes': [
                    models.Index(condition=models.Q(('status', 'pending')), fields=['run_at'], name='scheduled_jobs_due_idx'),
                    models.Index(fields=['tenant', '-created_at'], name='scheduled_jobs_tenant_idx'),
                ],
            },
        ),
        migrations.CreateModel(
            name='LaneLimit',
            fields=[
                ('lane_id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('rate_per_second', models.FloatField()),
                ('burst', models.FloatField(blank=True, null=True)),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('tenant', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
            ],
            options={
                'db_table': 'lane_limits',
            },
        ),
        migrations.RunPython(tune_queue_state, migrations.RunPython.noop),
    ]
