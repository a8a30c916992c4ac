# Category, Subscriber and Suppression move here from notifications with their tables (`categories`,
# `subscribers`, `suppressions`), which notifications' migrations made and which stay exactly as they
# are: this changes Django's state only (tables, constraints, indexes and rows untouched), and renames
# the models' content types so the permissions held on them stay held. notifications/0021 then
# forgets the models on its side.

import core.fields
import core.ids
import django.db.models.deletion
import django.db.models.functions.datetime
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
                    name='Category',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('key', models.SlugField(max_length=100)),
                        ('critical', models.BooleanField(default=False)),
                        ('description', models.TextField(blank=True, default='')),
                        ('quiet_hours', models.JSONField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('tenant', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
                    ],
                    options={
                        'verbose_name_plural': 'categories',
                        'db_table': 'categories',
                        'ordering': ['key'],
                        'constraints': [models.UniqueConstraint(fields=('tenant', 'key'), name='category_key_unique_per_tenant')],
                    },
                ),
                migrations.CreateModel(
                    name='Subscriber',
                    fields=[
                        ('id', models.UUIDField(default=core.ids.uuid7, editable=False, primary_key=True, serialize=False)),
                        ('external_id', models.CharField(max_length=200)),
                        ('email', core.fields.EncryptedTextField(blank=True, null=True)),
                        ('email_masked', models.CharField(blank=True, default='', max_length=200)),
                        ('phone', core.fields.EncryptedTextField(blank=True, null=True)),
                        ('phone_masked', models.CharField(blank=True, default='', max_length=40)),
                        ('push_tokens', core.fields.EncryptedJSONField(blank=True, default=list)),
                        ('push_tokens_masked', models.JSONField(blank=True, default=list)),
                        ('timezone', models.CharField(blank=True, default='', max_length=64)),
                        ('preferences', models.JSONField(blank=True, default=dict)),
                        ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                        ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                        ('tenant', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
                    ],
                    options={
                        'db_table': 'subscribers',
                        'indexes': [models.Index(fields=['tenant', '-created_at', '-id'], name='subscriber_tenant_recent_idx')],
                        'constraints': [models.UniqueConstraint(fields=('tenant', 'external_id'), name='subscriber_external_id_unique')],
                    },
                ),
                migrations.CreateModel(
                    name='Suppression',
                    fields=[
                        ('id', models.UUIDField(default=core.ids.uuid7, editable=False, primary_key=True, serialize=False)),
                        ('channel', models.CharField(choices=[('email', 'Email'), ('sms', 'Sms'), ('push', 'Push'), ('webhook', 'Webhook')], max_length=10)),
                        ('recipient', core.fields.EncryptedTextField()),
                        ('recipient_masked', models.CharField(max_length=200)),
                        ('recipient_index', models.CharField(max_length=64)),
                        ('reason', models.CharField(choices=[('hard_bounce', 'Hard Bounce'), ('complaint', 'Complaint'), ('unsubscribed', 'Unsubscribed'), ('manual', 'Manual')], max_length=16)),
                        ('category', models.CharField(blank=True, max_length=100, null=True)),
                        ('source_notification_id', models.UUIDField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                        ('tenant', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant')),
                    ],
                    options={
                        'db_table': 'suppressions',
                        'indexes': [models.Index(fields=['tenant', '-created_at', '-id'], name='suppression_tenant_recent_idx'), models.Index(fields=['tenant', 'recipient_index'], name='suppression_lookup_idx')],
                        'constraints': [models.UniqueConstraint(condition=models.Q(('category__isnull', True)), fields=('tenant', 'channel', 'recipient_index'), name='suppression_unique_all_categories'), models.UniqueConstraint(condition=models.Q(('category__isnull', False)), fields=('tenant', 'channel', 'recipient_index', 'category'), name='suppression_unique_per_category')],
                    },
                ),
            ],
        ),
        move_content_types('notifications', 'recipients', ['category', 'subscriber', 'suppression']),
    ]
