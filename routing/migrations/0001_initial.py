# ProviderCircuit moves here from notifications with its table, `provider_circuits`, which
# notifications' migrations made and which stays exactly as it is: this changes Django's state only
# (the table, its constraints and its rows are untouched), and renames the model's content type so
# the permissions held on it stay held. notifications/0022 then forgets the model on its side.

import django.db.models.deletion
from django.db import migrations, models

from core.model_moves import DEPENDENCIES, move_content_types


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('providers', '0001_initial'),
        *DEPENDENCIES,
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='ProviderCircuit',
                    fields=[
                        ('provider', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='circuit_row', serialize=False, to='providers.provider')),
                        ('state', models.CharField(default='closed', max_length=8)),
                        ('opened_at', models.DateTimeField(blank=True, null=True)),
                        ('probes', models.PositiveSmallIntegerField(default=0)),
                        ('window_started_at', models.DateTimeField()),
                        ('base_requests', models.BigIntegerField(default=0)),
                        ('base_failures', models.BigIntegerField(default=0)),
                        ('prev_requests', models.BigIntegerField(default=0)),
                        ('prev_failures', models.BigIntegerField(default=0)),
                        ('updated_at', models.DateTimeField()),
                    ],
                    options={
                        'db_table': 'provider_circuits',
                    },
                ),
            ],
        ),
        move_content_types('notifications', 'routing', ['providercircuit']),
    ]
