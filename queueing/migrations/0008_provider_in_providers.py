# Provider now belongs to the providers app (providers/0001): the lane's foreign key is re-pointed in
# Django's state only; queue_state's column is untouched (it never had a database constraint).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('providers', '0001_initial'),
        ('queueing', '0007_tenant_idx_without_priority'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='queueitem',
                    name='provider',
                    field=models.ForeignKey(db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='providers.provider'),
                ),
            ],
        ),
    ]
