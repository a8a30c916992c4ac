# The Provider model moves here from notifications with its table, `providers`, which notifications'
# migrations made and which stays exactly as it is: this changes Django's state only (the table, its
# constraints and its rows are untouched), and renames the model's content type so the permissions
# held on it stay held. The foreign keys to it are re-pointed by each app that has one (queueing/0008,
# dlq/0004, receipts/0003, notifications/0020), then notifications/0020 forgets the model on its side.

import core.fields
import django.db.models.deletion
from django.db import migrations, models

from core.model_moves import DEPENDENCIES, move_content_types


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('core', '0004_tenant_weight'),
        *DEPENDENCIES,
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Provider',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.SlugField(max_length=100)),
                        ('channel', models.CharField(choices=[('email', 'Email'), ('sms', 'Sms'), ('push', 'Push'), ('webhook', 'Webhook')], max_length=10)),
                        ('kind', models.CharField(choices=[('webhook', 'Webhook'), ('smtp', 'Smtp'), ('twilio', 'Twilio'), ('sendgrid', 'SendGrid'), ('console', 'Console'), ('ses', 'Ses')], max_length=10)),
                        ('config', models.JSONField(blank=True, default=dict)),
                        ('secrets', core.fields.EncryptedJSONField(blank=True, default=dict)),
                        ('rate_per_second', models.FloatField(blank=True, null=True)),
                        ('burst', models.PositiveIntegerField(blank=True, null=True)),
                        ('max_attempts', models.PositiveSmallIntegerField(blank=True, null=True)),
                        ('is_default', models.BooleanField(default=False)),
                        ('failover_order', models.PositiveSmallIntegerField(blank=True, null=True)),
                        ('circuit', models.JSONField(blank=True, default=dict)),
                        ('previous_secrets', core.fields.EncryptedJSONField(blank=True, null=True)),
                        ('secrets_rotated_at', models.DateTimeField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('tenant', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
                    ],
                    options={
                        'db_table': 'providers',
                        'ordering': ['name'],
                        'constraints': [models.UniqueConstraint(fields=('tenant', 'name'), name='provider_name_unique_per_tenant'), models.UniqueConstraint(condition=models.Q(('is_default', True)), fields=('tenant', 'channel'), name='provider_one_default_per_channel')],
                    },
                ),
            ],
        ),
        move_content_types('notifications', 'providers', ['provider']),
    ]
