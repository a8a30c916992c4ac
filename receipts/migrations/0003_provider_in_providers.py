# Provider now belongs to the providers app (providers/0001): the foreign key is re-pointed in
# Django's state only (the column is untouched), before notifications forgets the model (run_before,
# so notifications' migrations need not know this app).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('providers', '0001_initial'),
        ('receipts', '0002_partitioned_events'),
    ]

    run_before = [
        ('notifications', '0021_provider_in_providers'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='notificationevent',
                    name='provider',
                    field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='providers.provider'),
                ),
            ],
        ),
    ]
