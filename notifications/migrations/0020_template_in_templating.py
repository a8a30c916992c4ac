# Template now belongs to templating (templating/0001 holds its state and content type): the foreign
# keys to it are re-pointed and the model is forgotten here, in Django's state only. `templates` and
# the foreign keys' columns and constraints stay exactly as they are.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0019_lane_limits'),
        ('templating', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='notification',
                    name='template',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='templating.template'),
                ),
                migrations.AlterField(
                    model_name='sequencestep',
                    name='template',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='templating.template'),
                ),
                migrations.DeleteModel(
                    name='Template',
                ),
            ],
        ),
    ]
