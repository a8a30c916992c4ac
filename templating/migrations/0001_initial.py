# The Template model moves here from notifications with its table, `templates`, which notifications'
# migrations made and which stays exactly as it is: this changes Django's state only (the table, its
# constraints and its rows are untouched), and renames the model's content type so the permissions
# held on it stay held. notifications/0019 then forgets the model on its side.

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
                    name='Template',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('key', models.SlugField(max_length=100)),
                        ('channel', models.CharField(choices=[('email', 'Email'), ('sms', 'Sms'), ('push', 'Push'), ('webhook', 'Webhook')], max_length=10)),
                        ('subject', models.TextField(blank=True, default='')),
                        ('body', models.TextField()),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('tenant', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
                    ],
                    options={
                        'db_table': 'templates',
                        'ordering': ['key'],
                        'constraints': [models.UniqueConstraint(fields=('tenant', 'key'), name='template_key_unique_per_tenant')],
                    },
                ),
            ],
        ),
        move_content_types('notifications', 'templating', ['template']),
    ]
