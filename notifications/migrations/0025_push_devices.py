import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0004_tenant_weight'),
        ('notifications', '0024_provider_messages'),
    ]

    operations = [
        migrations.AddField(
            model_name='notification',
            name='push',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name='NotificationDevice',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('device_id', models.UUIDField()),
                ('kind', models.CharField(max_length=10)),
                ('provider_id', models.BigIntegerField()),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered'), ('failed', 'Failed'), ('deactivated', 'Deactivated')], default='pending', max_length=12)),
                ('error_code', models.CharField(blank=True, default='', max_length=100)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('notification', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='device_results', to='notifications.notification')),
                ('tenant', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
            ],
            options={
                'db_table': 'notification_devices',
                'constraints': [models.UniqueConstraint(fields=('notification', 'device_id'), name='notification_device_unique')],
            },
        ),
    ]
