# Provider now belongs to the providers app (providers/0001): the foreign key is re-pointed in
# Django's state only (the column and its constraint on `providers` stay as they are), before
# notifications forgets the model (run_before, so notifications' migrations need not know this app).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dlq', '0003_console_recent_indexes'),
        ('providers', '0001_initial'),
    ]

    run_before = [
        ('notifications', '0021_provider_in_providers'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='deadletter',
                    name='provider',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='providers.provider'),
                ),
            ],
        ),
    ]
