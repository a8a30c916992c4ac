# ProviderCircuit now belongs to routing (routing/0001 holds its state and content type): it is
# forgotten here, in Django's state only; `provider_circuits` stays as it is.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0022_recipients_in_recipients'),
        ('routing', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='ProviderCircuit',
                ),
            ],
        ),
    ]
