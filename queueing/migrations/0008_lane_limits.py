# Lanes get their configured limits in a table of queueing's own (filled from the providers by
# notifications/0019): whether a new item is rate-limited is then decided from queueing's data.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0004_tenant_weight'),
        ('queueing', '0007_tenant_idx_without_priority'),
    ]

    operations = [
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
    ]
