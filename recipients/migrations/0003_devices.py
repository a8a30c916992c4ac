import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

import core.fields
import core.ids


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0004_tenant_weight'),
        ('recipients', '0002_unsubscribe_token_revocations'),
    ]

    operations = [
        migrations.CreateModel(
            name='Device',
            fields=[
                ('id', models.UUIDField(default=core.ids.uuid7, editable=False, primary_key=True, serialize=False)),
                ('kind', models.CharField(choices=[('fcm', 'FCM'), ('apns', 'APNs'), ('webpush', 'Web Push')], max_length=10)),
                ('token', core.fields.EncryptedTextField()),
                ('token_masked', models.CharField(max_length=200)),
                ('token_index', models.CharField(max_length=64)),
                ('active', models.BooleanField(default=True)),
                ('deactivated_reason', models.CharField(blank=True, max_length=100, null=True)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
                ('subscriber', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='devices', to='recipients.subscriber')),
                ('tenant', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
            ],
            options={
                'db_table': 'devices',
                'indexes': [models.Index(fields=['subscriber', '-created_at', '-id'], name='device_subscriber_recent_idx')],
                'constraints': [models.UniqueConstraint(fields=('tenant', 'token_index'), name='device_token_unique_per_tenant')],
            },
        ),
    ]
