# Provider now belongs to the providers app (providers/0001 holds its state and content type): this
# app's foreign keys to it are re-pointed and the model is forgotten here, in Django's state only.
# `providers` and the foreign keys' columns and constraints stay exactly as they are. The apps above
# this one re-point theirs first (their migrations `run_before` this one).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0020_template_in_templating'),
        ('providers', '0001_initial'),
        ('queueing', '0009_plain_ids'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='notification',
                    name='provider',
                    field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.PROTECT, related_name='notifications', to='providers.provider'),
                ),
                migrations.AlterField(
                    model_name='providercircuit',
                    name='provider',
                    field=models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='circuit_row', serialize=False, to='providers.provider'),
                ),
                migrations.AlterField(
                    model_name='deliveryattempt',
                    name='provider',
                    field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='providers.provider'),
                ),
                migrations.DeleteModel(
                    name='Provider',
                ),
            ],
        ),
    ]
